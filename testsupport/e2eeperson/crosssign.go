package e2eeperson

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto/signatures"
	"maunium.net/go/mautrix/id"
)

// DeviceIsCrossSigned reports whether userID's device deviceID is signed
// by userID's self-signing key, itself signed by userID's master key, as
// this person's client sees them in a /keys/query now: Element's "verified
// by its owner". A user without cross-signing keys, or whose device the
// self-signing key never signed, gives false; an error is a failed query
// or a device the server does not list.
func (c *Client) DeviceIsCrossSigned(ctx context.Context, userID, deviceID string) (bool, error) {
	user := id.UserID(userID)
	var resp struct {
		DeviceKeys      map[id.UserID]map[id.DeviceID]json.RawMessage `json:"device_keys"`
		MasterKeys      map[id.UserID]json.RawMessage                 `json:"master_keys"`
		SelfSigningKeys map[id.UserID]json.RawMessage                 `json:"self_signing_keys"`
	}
	// The signed objects are kept as the server sent them: a signature
	// covers every field, including any mautrix's structs would drop.
	req := map[string]any{"device_keys": map[id.UserID][]string{user: {deviceID}}}
	if _, err := c.cli.MakeRequest(ctx, http.MethodPost, c.cli.BuildClientURL("v3", "keys", "query"), req, &resp); err != nil {
		return false, fmt.Errorf("query keys of %s: %w", userID, err)
	}
	device, ok := resp.DeviceKeys[user][id.DeviceID(deviceID)]
	if !ok {
		return false, fmt.Errorf("the server lists no keys for device %s of %s", deviceID, userID)
	}
	master, err := crossSigningKey(resp.MasterKeys[user], user, id.XSUsageMaster)
	if err != nil || master == "" {
		return false, err
	}
	selfSigning, err := crossSigningKey(resp.SelfSigningKeys[user], user, id.XSUsageSelfSigning)
	if err != nil || selfSigning == "" {
		return false, err
	}
	if ok, err := signedBy(resp.SelfSigningKeys[user], user, master); !ok || err != nil {
		return false, err
	}
	return signedBy(device, user, selfSigning)
}

// crossSigningKey returns the one public key of a cross-signing key
// object of user with usage, "" for a missing object.
func crossSigningKey(raw json.RawMessage, user id.UserID, usage id.CrossSigningUsage) (id.Ed25519, error) {
	if raw == nil {
		return "", nil
	}
	var key mautrix.CrossSigningKeys
	if err := json.Unmarshal(raw, &key); err != nil {
		return "", fmt.Errorf("read %s key of %s: %w", usage, user, err)
	}
	if key.UserID != user || !slices.Contains(key.Usage, usage) || len(key.Keys) != 1 {
		return "", fmt.Errorf("malformed %s key of %s: %s", usage, user, raw)
	}
	return key.FirstKey(), nil
}

// signedBy reports whether the signed JSON object raw carries a valid
// signature of user's key.
func signedBy(raw json.RawMessage, user id.UserID, key id.Ed25519) (bool, error) {
	ok, err := signatures.VerifySignatureJSON(raw, user, key.String(), key)
	if errors.Is(err, signatures.ErrSignatureNotFound) {
		return false, nil
	}
	return ok, err
}

// CrossSignOwnDevice gives the person cross-signing keys, as Element's
// "set up secure backup" does: it makes master, self-signing and
// user-signing keys, uploads them (authenticating with the account's
// password), and signs its own device with the self-signing key. The
// private keys stay in memory; nothing goes to secret storage.
func (c *Client) CrossSignOwnDevice(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	keys, err := c.mach.GenerateCrossSigningKeys()
	if err != nil {
		return c.fail("make cross-signing keys", err)
	}
	err = c.mach.PublishCrossSigningKeys(ctx, keys, func(ui *mautrix.RespUserInteractive) any {
		return &mautrix.ReqUIAuthLogin{
			BaseAuthData: mautrix.BaseAuthData{Type: mautrix.AuthTypePassword, Session: ui.Session},
			User:         c.UserID(),
			Password:     c.password,
		}
	})
	if err != nil {
		return c.fail("upload cross-signing keys", err)
	}
	if err := c.mach.SignOwnDevice(ctx, c.mach.OwnIdentity()); err != nil {
		return c.fail("sign own device", err)
	}
	return nil
}
