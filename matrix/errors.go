package matrix

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"maunium.net/go/mautrix"
)

// Errors.
var (
	// ErrInvalidToken is the homeserver refusing an access token
	// (M_UNKNOWN_TOKEN): revoked, expired or never issued. An HTTPError
	// with that code unwraps to it.
	ErrInvalidToken = errors.New("access token refused by the homeserver")
	// ErrInvalidConfig refuses a Config that cannot log in.
	ErrInvalidConfig = errors.New("invalid matrix config")
	// ErrWrongUser refuses credentials that belong to another account than
	// the configured one.
	ErrWrongUser = errors.New("credentials belong to another user")
)

// HTTPError is a homeserver's refusal: a response outside 2xx. Network
// failures are not HTTPErrors; they reach the caller as the transport's
// own error.
type HTTPError struct {
	// Status is the HTTP status code.
	Status int
	// ErrCode is the Matrix errcode ("M_FORBIDDEN"); empty when the body
	// carried none.
	ErrCode string
	// Message is the server's error text.
	Message string
	// RetryAfter is how long the server asked the client to wait (a 429's
	// retry_after_ms, or its Retry-After header); zero when it did not say.
	RetryAfter time.Duration
}

// Error implements error.
func (e *HTTPError) Error() string {
	s := "homeserver answered HTTP " + strconv.Itoa(e.Status)
	if e.ErrCode != "" {
		s += " " + e.ErrCode
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.RetryAfter > 0 {
		s += " (retry after " + e.RetryAfter.String() + ")"
	}
	return s
}

// Unwrap lets errors.Is(err, ErrInvalidToken) recognise a refused token.
func (e *HTTPError) Unwrap() error {
	if e.ErrCode == "M_UNKNOWN_TOKEN" {
		return ErrInvalidToken
	}
	return nil
}

// mapError turns mautrix's error for a refused request into an HTTPError.
// Anything else (the network, a cancelled context, an undecodable 2xx
// body) is returned as it is.
func mapError(err error) error {
	var he mautrix.HTTPError
	if err == nil || !errors.As(err, &he) || he.Response == nil {
		return err
	}
	status := he.Response.StatusCode
	if status >= 200 && status < 300 {
		if he.WrappedError != nil {
			return fmt.Errorf("read response: %w", he.WrappedError)
		}
		return err
	}
	out := &HTTPError{Status: status}
	if re := he.RespError; re != nil {
		out.ErrCode, out.Message = re.ErrCode, re.Err
		if ms, ok := re.ExtraData["retry_after_ms"].(float64); ok && ms > 0 {
			out.RetryAfter = time.Duration(ms) * time.Millisecond
		}
	}
	if out.RetryAfter == 0 {
		out.RetryAfter = retryAfterHeader(he.Response)
	}
	return out
}

// retryAfterHeader reads a Retry-After header given in seconds (the
// HTTP-date form is not used by homeservers).
func retryAfterHeader(resp *http.Response) time.Duration {
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || secs <= 0 {
		return 0
	}
	return time.Duration(secs) * time.Second
}
