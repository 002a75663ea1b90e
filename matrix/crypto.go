package matrix

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/id"
)

// Encrypter seals what the client sends into an encrypted room.
type Encrypter interface {
	// Seal returns the event to send into room for an eventType event with
	// content: the same event in a room without encryption, an
	// m.room.encrypted one in a room whose state says it is encrypted. It
	// never lets plaintext through into an encrypted room: a room it
	// cannot encrypt for is an error.
	Seal(ctx context.Context, room, eventType string, content json.RawMessage) (string, json.RawMessage, error)
	// Encrypts reports whether what goes into room is encrypted, as Seal
	// decides it; a room it cannot tell about is an error.
	Encrypts(ctx context.Context, room string) (bool, error)
}

// SetEncrypter has every later Send sealed by e. Set it before the client
// is shared.
func (c *Client) SetEncrypter(e Encrypter) { c.encrypter = e }

// seal hands an event to the Encrypter, when there is one.
func (c *Client) seal(ctx context.Context, room, eventType string, content json.RawMessage) (string, json.RawMessage, error) {
	if c.encrypter == nil {
		return eventType, content, nil
	}
	return c.encrypter.Seal(ctx, room, eventType, content)
}

// CryptoClient returns a mautrix client for the crypto engine's own
// requests (key uploads and queries, one-time key claims, to-device
// sends), signed in as this client: each request carries the client's
// current access token, so a re-login reaches it too.
func (c *Client) CryptoClient() *mautrix.Client {
	mx, _ := mautrix.NewClient(c.mx.HomeserverURL.String(), c.mx.UserID, "")
	mx.DeviceID = id.DeviceID(c.DeviceID())
	mx.Log = zerolog.Nop()
	base := c.mx.Client.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	mx.Client = &http.Client{Transport: bearer{c: c, next: base}}
	return mx
}

// bearer sets the client's current access token on each request.
type bearer struct {
	c    *Client
	next http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (b bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	b.c.mu.Lock()
	token := b.c.token
	b.c.mu.Unlock()
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+token)
	return b.next.RoundTrip(req)
}
