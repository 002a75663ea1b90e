// Package matrix is mindroomd's port to a Matrix homeserver: login with a
// device kept across restarts, the raw sync the journal admits, history
// and relation pages, single events, sends under a caller's transaction ID,
// joins and leaves. It rides on mautrix's low-level client only: mautrix's
// Syncer stores the sync token before handlers run, and its transaction IDs
// are random, both fatal to exactly-once delivery, so neither is used.
//
// Events are handed over as the raw JSON the server sent, never decoded
// into mautrix's typed events and encoded again, which would reorder keys
// and turn large integers into floats.
package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/journal"
)

// requestTimeout bounds one request other than a sync's long poll, so a
// stalled connection cannot hold a caller that set no deadline.
const requestTimeout = 60 * time.Second

// Config says how one agent reaches its homeserver.
type Config struct {
	// Homeserver is the client-server API base URL.
	Homeserver string
	// UserID is the agent's full Matrix user ID.
	UserID string
	// Password logs in when no valid access token is at hand. Never logged.
	Password string `json:"-"`
	// AccessToken is tried first when set; Password is the fallback. With
	// no Password, a refused AccessToken is fatal (ErrInvalidToken). Never
	// logged.
	AccessToken string `json:"-"`
	// Agent names the session file: <StorageDir>/matrix/<Agent>.session.json.
	Agent string
	// StorageDir is the daemon's storage directory.
	StorageDir string
	// Log receives the port's own records (device changes, failed event
	// fetches); mautrix's per-request records are off.
	Log zerolog.Logger `json:"-"`
	// HTTPClient carries the requests; nil means a client with no overall
	// timeout (each request is bounded by its context instead, and a sync
	// by its long-poll timeout).
	HTTPClient *http.Client `json:"-"`
}

// String describes the config without its secrets: a password in the
// homeserver URL is masked too.
func (c Config) String() string {
	return fmt.Sprintf("matrix config for %s as %s on %s (password set: %t, access token set: %t)",
		c.Agent, c.UserID, redactedURL(c.Homeserver), c.Password != "", c.AccessToken != "")
}

// redactedURL shows a URL with its password masked, and nothing of one
// that does not parse, which may hold a password where none is expected.
func redactedURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(an unreadable URL)"
	}
	return u.Redacted()
}

// MarshalJSON encodes the config without its secrets.
func (c Config) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Homeserver, UserID, Agent, StorageDir string
	}{redactedURL(c.Homeserver), c.UserID, c.Agent, c.StorageDir})
}

// GoString is String, so %#v cannot print the secrets either.
func (c Config) GoString() string { return c.String() }

// Client is one agent's logged-in connection to its homeserver.
type Client struct {
	mx            *mautrix.Client
	agent         string
	log           zerolog.Logger
	deviceChanged bool
}

// Login connects cfg's agent, keeping the device of its previous run.
//
// The access token is taken, in order, from cfg.AccessToken, then the
// session file, the first one the server accepts (whoami) winning. When
// neither is accepted, cfg.Password logs in naming the stored device, so
// the server keeps that device and only issues a new token: servers
// remember transaction IDs per device at best, and a new device would make
// every pending delivery need reconciling. (Dendrite remembers them per
// access token, in memory, so there even a new token forgets them.) If the
// server still hands out another device, the change is logged and reported
// by DeviceChanged. With no password, a refused configured token is
// ErrInvalidToken.
func Login(ctx context.Context, cfg Config) (*Client, error) {
	if _, err := journal.NewPrincipal(cfg.Agent, cfg.UserID); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.StorageDir == "" {
		return nil, fmt.Errorf("%w: storage directory is required", ErrInvalidConfig)
	}
	if cfg.Password == "" && cfg.AccessToken == "" {
		return nil, fmt.Errorf("%w: a password or an access token is required", ErrInvalidConfig)
	}
	mx, err := mautrix.NewClient(cfg.Homeserver, id.UserID(cfg.UserID), "")
	if err != nil {
		return nil, fmt.Errorf("%w: homeserver URL: %w", ErrInvalidConfig, err)
	}
	mx.Log = zerolog.Nop()
	mx.Client = cfg.HTTPClient
	if mx.Client == nil {
		mx.Client = &http.Client{}
	}
	c := &Client{mx: mx, agent: cfg.Agent, log: cfg.Log}

	path := sessionPath(cfg.StorageDir, cfg.Agent)
	stored, err := readSession(path)
	if err != nil {
		return nil, err
	}
	if stored.UserID != "" && stored.UserID != cfg.UserID {
		c.log.Warn().Str("agent", cfg.Agent).Str("stored_user_id", stored.UserID).Str("user_id", cfg.UserID).
			Msg("Session file belongs to another user; it is replaced")
		stored = session{}
	}

	now, err := c.establish(ctx, cfg, stored)
	if err != nil {
		return nil, err
	}
	if stored.DeviceID != "" && now.DeviceID != stored.DeviceID {
		c.deviceChanged = true
		c.log.Warn().Str("agent", cfg.Agent).Str("old_device_id", stored.DeviceID).Str("device_id", now.DeviceID).
			Msg("Matrix device changed: deliveries attempted from the old device will be reconciled before any resend")
	}
	if now != stored {
		if err := writeSession(path, now); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// establish finds a valid token for cfg and returns the session it makes.
func (c *Client) establish(ctx context.Context, cfg Config, stored session) (session, error) {
	for i, token := range []string{cfg.AccessToken, stored.AccessToken} {
		if token == "" || (i > 0 && token == cfg.AccessToken) {
			continue
		}
		c.mx.AccessToken = token
		userID, deviceID, err := c.WhoAmI(ctx)
		switch {
		case errors.Is(err, ErrInvalidToken):
			continue
		case err != nil:
			return session{}, fmt.Errorf("check access token: %w", err)
		case userID != cfg.UserID:
			return session{}, fmt.Errorf("%w: the access token is %s's, not %s's", ErrWrongUser, userID, cfg.UserID)
		case deviceID == "":
			return session{}, errors.New("check access token: the homeserver did not name the token's device")
		}
		return c.adopt(userID, deviceID, token), nil
	}
	if cfg.Password == "" {
		return session{}, fmt.Errorf("the configured access token was refused and no password is configured: %w", ErrInvalidToken)
	}
	c.mx.AccessToken = ""
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := c.mx.Login(quiet(ctx), &mautrix.ReqLogin{
		Type:                     mautrix.AuthTypePassword,
		Identifier:               mautrix.UserIdentifier{Type: mautrix.IdentifierTypeUser, User: cfg.UserID},
		Password:                 cfg.Password,
		DeviceID:                 id.DeviceID(stored.DeviceID),
		InitialDeviceDisplayName: "mindroomd " + cfg.Agent,
	})
	if err != nil {
		return session{}, fmt.Errorf("log in with password: %w", mapError(err))
	}
	switch {
	case resp.UserID.String() != cfg.UserID:
		return session{}, fmt.Errorf("%w: logged in as %s, not %s", ErrWrongUser, resp.UserID, cfg.UserID)
	case resp.AccessToken == "" || resp.DeviceID == "":
		return session{}, errors.New("log in with password: the homeserver returned no token or device")
	}
	return c.adopt(resp.UserID.String(), resp.DeviceID.String(), resp.AccessToken), nil
}

func (c *Client) adopt(userID, deviceID, token string) session {
	c.mx.UserID, c.mx.DeviceID, c.mx.AccessToken = id.UserID(userID), id.DeviceID(deviceID), token
	return session{UserID: userID, DeviceID: deviceID, AccessToken: token}
}

// UserID is the logged-in user.
func (c *Client) UserID() string { return c.mx.UserID.String() }

// DeviceID is the device the client sends from.
func (c *Client) DeviceID() string { return c.mx.DeviceID.String() }

// DeviceChanged reports that the login ended on another device than the
// one the session file named.
func (c *Client) DeviceChanged() bool { return c.deviceChanged }

// String names the client without its token.
func (c *Client) String() string {
	return "matrix client " + c.agent + " as " + c.UserID() + " on device " + c.DeviceID()
}

// WhoAmI asks the server whose token this is.
func (c *Client) WhoAmI(ctx context.Context) (userID, deviceID string, err error) {
	var resp struct {
		UserID   string `json:"user_id"`
		DeviceID string `json:"device_id"`
	}
	if err := c.do(ctx, http.MethodGet, c.mx.BuildClientURL("v3", "account", "whoami"), nil, &resp); err != nil {
		return "", "", fmt.Errorf("whoami: %w", err)
	}
	return resp.UserID, resp.DeviceID, nil
}

// do makes one request without retries (the caller owns its retry policy)
// and decodes a 2xx body into out. body, when set, is sent exactly as
// given.
func (c *Client) do(ctx context.Context, method, url string, body json.RawMessage, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, requestTimeout)
		defer cancel()
	}
	req := mautrix.FullRequest{Method: method, URL: url, ResponseJSON: out, MaxAttempts: 1}
	if body != nil {
		req.RequestBytes = body
		req.Headers = http.Header{"Content-Type": {"application/json"}}
	}
	_, err := c.mx.MakeFullRequest(quiet(ctx), req)
	return mapError(err)
}

// quiet hides any logger the caller's context carries from mautrix, which
// would otherwise record every request (each sync) to it at debug level;
// the port logs what matters itself.
func quiet(ctx context.Context) context.Context {
	return zerolog.Nop().WithContext(ctx)
}
