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
	"sync"
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
	// Agent names the agent's session among Sessions.
	Agent string
	// StorageDir is the daemon's storage directory.
	StorageDir string
	// Sessions keeps the agent's session between runs; nil means
	// FileSessions in StorageDir.
	Sessions Sessions `json:"-"`
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
//
// The access token is kept here, not in mautrix's client, and set on each
// request: a re-login replaces it while other requests are under way.
type Client struct {
	mx            *mautrix.Client
	agent         string
	log           zerolog.Logger
	deviceChanged bool
	// cfg and sessions serve a re-login: the password, and where the new
	// session is kept.
	cfg      Config
	sessions Sessions

	mu       sync.Mutex
	token    string
	deviceID string
	// session counts the re-logins of this run.
	session uint64

	// relogging serialises re-logins, so a refusal seen by several
	// requests at once logs in once.
	relogging sync.Mutex
	// warned is set once a refused token without a password was logged.
	warned bool
	// encrypter seals sends into encrypted rooms (SetEncrypter).
	encrypter Encrypter
}

// Login connects cfg's agent, keeping the device of its previous run.
//
// The access token is taken, in order, from cfg.AccessToken, then the
// stored session (cfg.Sessions), the first one the server accepts (whoami) winning. When
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
	if cfg.Sessions == nil {
		cfg.Sessions = FileSessions{StorageDir: cfg.StorageDir}
	}
	c := &Client{mx: mx, agent: cfg.Agent, log: cfg.Log, cfg: cfg, sessions: cfg.Sessions}

	stored, err := c.sessions.LoadSession(ctx, cfg.Agent)
	if err != nil {
		return nil, err
	}
	if stored.UserID != "" && stored.UserID != cfg.UserID {
		c.log.Warn().Str("agent", cfg.Agent).Str("stored_user_id", stored.UserID).Str("user_id", cfg.UserID).
			Msg("Session file belongs to another user; it is replaced")
		stored = Session{}
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
		if err := c.sessions.SaveSession(ctx, cfg.Agent, now); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// establish finds a valid token for cfg and returns the session it makes.
func (c *Client) establish(ctx context.Context, cfg Config, stored Session) (Session, error) {
	for i, token := range []string{cfg.AccessToken, stored.AccessToken} {
		if token == "" || (i > 0 && token == cfg.AccessToken) {
			continue
		}
		userID, deviceID, err := c.whoAmI(ctx, token)
		switch {
		case errors.Is(err, ErrInvalidToken):
			continue
		case err != nil:
			return Session{}, fmt.Errorf("check access token: %w", err)
		case userID != cfg.UserID:
			return Session{}, fmt.Errorf("%w: the access token is %s's, not %s's", ErrWrongUser, userID, cfg.UserID)
		case deviceID == "":
			return Session{}, errors.New("check access token: the homeserver did not name the token's device")
		}
		return c.adopt(userID, deviceID, token), nil
	}
	if cfg.Password == "" {
		return Session{}, fmt.Errorf("the configured access token was refused and no password is configured: %w", ErrInvalidToken)
	}
	now, err := c.passwordLogin(ctx, stored.DeviceID)
	if err != nil {
		return Session{}, err
	}
	return c.adopt(now.UserID, now.DeviceID, now.AccessToken), nil
}

// passwordLogin logs in with the configured password, naming deviceID so
// the server keeps that device.
func (c *Client) passwordLogin(ctx context.Context, deviceID string) (Session, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := c.mx.Login(quiet(ctx), &mautrix.ReqLogin{
		Type:                     mautrix.AuthTypePassword,
		Identifier:               mautrix.UserIdentifier{Type: mautrix.IdentifierTypeUser, User: c.cfg.UserID},
		Password:                 c.cfg.Password,
		DeviceID:                 id.DeviceID(deviceID),
		InitialDeviceDisplayName: "mindroomd " + c.cfg.Agent,
	})
	if err != nil {
		return Session{}, fmt.Errorf("log in with password: %w", mapError(err))
	}
	switch {
	case resp.UserID.String() != c.cfg.UserID:
		return Session{}, fmt.Errorf("%w: logged in as %s, not %s", ErrWrongUser, resp.UserID, c.cfg.UserID)
	case resp.AccessToken == "" || resp.DeviceID == "":
		return Session{}, errors.New("log in with password: the homeserver returned no token or device")
	}
	return Session{UserID: resp.UserID.String(), DeviceID: resp.DeviceID.String(), AccessToken: resp.AccessToken}, nil
}

func (c *Client) adopt(userID, deviceID, token string) Session {
	c.mx.UserID = id.UserID(userID)
	c.mu.Lock()
	c.deviceID, c.token = deviceID, token
	c.mu.Unlock()
	return Session{UserID: userID, DeviceID: deviceID, AccessToken: token}
}

// relogin replaces a token the homeserver refused (M_UNKNOWN_TOKEN: the
// session was signed out, the password reset) by a password login naming
// the device, and keeps the new token in the stored session. refused is the
// session whose token was refused: when another request has logged in
// again since, its token is used instead. Without a password there is
// nothing to log in with: the refusal is logged once and returned.
func (c *Client) relogin(ctx context.Context, refused uint64) error {
	c.relogging.Lock()
	defer c.relogging.Unlock()
	c.mu.Lock()
	current, deviceID := c.session, c.deviceID
	c.mu.Unlock()
	if current != refused {
		return nil
	}
	if c.cfg.Password == "" {
		if !c.warned {
			c.warned = true
			c.log.Error().Str("agent", c.agent).Str("device_id", deviceID).
				Msg("The homeserver refused the access token and no password is configured: nothing is synced or sent until the daemon is restarted with a valid token; replies stay owed")
		}
		return errors.New("no password is configured to log in again")
	}
	now, err := c.passwordLogin(ctx, deviceID)
	if err != nil {
		return err
	}
	if err := c.sessions.SaveSession(ctx, c.agent, now); err != nil {
		return err
	}
	c.mu.Lock()
	c.token, c.deviceID = now.AccessToken, now.DeviceID
	c.session++
	c.mu.Unlock()
	if now.DeviceID != deviceID {
		c.deviceChanged = true
		c.log.Warn().Str("agent", c.agent).Str("old_device_id", deviceID).Str("device_id", now.DeviceID).
			Msg("Matrix device changed at a re-login: deliveries attempted from the old device will be reconciled before any resend")
	} else {
		c.log.Info().Str("agent", c.agent).Str("device_id", now.DeviceID).
			Msg("The homeserver refused the access token; logged in again with the password on the same device")
	}
	return nil
}

// UserID is the logged-in user.
func (c *Client) UserID() string { return c.mx.UserID.String() }

// DeviceID is the device the client sends from.
func (c *Client) DeviceID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deviceID
}

// Session counts the client's re-logins: each one is a new access token,
// and a homeserver that keeps transaction IDs per token (Dendrite) no
// longer deduplicates a send made under the old one.
func (c *Client) Session() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session
}

// DeviceChanged reports that the login ended on another device than the
// one the session file named.
func (c *Client) DeviceChanged() bool {
	c.relogging.Lock()
	defer c.relogging.Unlock()
	return c.deviceChanged
}

// String names the client without its token.
func (c *Client) String() string {
	return "matrix client " + c.agent + " as " + c.UserID() + " on device " + c.DeviceID()
}

// WhoAmI asks the server whose token this is.
func (c *Client) WhoAmI(ctx context.Context) (userID, deviceID string, err error) {
	var resp whoAmIResponse
	if err := c.do(ctx, http.MethodGet, c.mx.BuildClientURL("v3", "account", "whoami"), nil, &resp); err != nil {
		return "", "", fmt.Errorf("whoami: %w", err)
	}
	return resp.UserID, resp.DeviceID, nil
}

type whoAmIResponse struct {
	UserID   string `json:"user_id"`
	DeviceID string `json:"device_id"`
}

// whoAmI asks whose token is token, one the login is still deciding on.
func (c *Client) whoAmI(ctx context.Context, token string) (userID, deviceID string, err error) {
	var resp whoAmIResponse
	if err := c.request(ctx, token, http.MethodGet, c.mx.BuildClientURL("v3", "account", "whoami"), nil, &resp); err != nil {
		return "", "", fmt.Errorf("whoami: %w", err)
	}
	return resp.UserID, resp.DeviceID, nil
}

// do makes one request without retries (the caller owns its retry policy)
// and decodes a 2xx body into out. body, when set, is sent exactly as
// given. A refused token is the one exception: the client logs in again
// (relogin) and makes the request once more with the new token. The server
// refused the first request, so nothing of it took effect, and a send
// under the same transaction ID is still one event.
func (c *Client) do(ctx context.Context, method, url string, body json.RawMessage, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, requestTimeout)
		defer cancel()
	}
	c.mu.Lock()
	token, session := c.token, c.session
	c.mu.Unlock()
	err := c.request(ctx, token, method, url, body, out)
	if !errors.Is(err, ErrInvalidToken) {
		return err
	}
	if rerr := c.relogin(ctx, session); rerr != nil {
		return fmt.Errorf("%w; log in again: %w", err, rerr)
	}
	c.mu.Lock()
	token = c.token
	c.mu.Unlock()
	return c.request(ctx, token, method, url, body, out)
}

// request makes one request with token.
func (c *Client) request(ctx context.Context, token, method, url string, body json.RawMessage, out any) error {
	req := mautrix.FullRequest{Method: method, URL: url, ResponseJSON: out, MaxAttempts: 1, Headers: http.Header{}}
	if token != "" {
		req.Headers.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.RequestBytes = body
		req.Headers.Set("Content-Type", "application/json")
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
