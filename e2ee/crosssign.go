package e2ee

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto/signatures"
	"maunium.net/go/mautrix/crypto/ssss"
	"maunium.net/go/mautrix/crypto/utils"
	"maunium.net/go/mautrix/id"
)

// CrossSignOptions configure cross-signing of the agent's account.
type CrossSignOptions struct {
	// RecoveryKeyFile holds the account's recovery key (the SSSS key, in
	// the base58 "EsT…" form a person can type into Element). Written 0600
	// when cross-signing is bootstrapped here; read on later starts.
	RecoveryKeyFile string
	// Password, when set, answers the homeserver's user-interactive auth
	// for uploading cross-signing keys. Never logged.
	Password string `json:"-"`
}

// String describes the options without the password.
func (o CrossSignOptions) String() string {
	return fmt.Sprintf("cross-signing options (recovery key file %s, password set: %t)", o.RecoveryKeyFile, o.Password != "")
}

// GoString is String, so %#v cannot print the password either.
func (o CrossSignOptions) GoString() string { return o.String() }

// CrossSignStatus reports the device's standing.
type CrossSignStatus struct {
	// CrossSigned is whether the homeserver publishes the device as signed
	// by the account's self-signing key, itself signed by the master key:
	// what a person's client shows as verified by its owner.
	CrossSigned bool
	// Bootstrapped is whether this start made the account's cross-signing
	// keys.
	Bootstrapped bool
	// Reason says, when the device is not cross-signed, what is missing,
	// in words an operator can act on.
	Reason string
}

// CrossSign has the agent's device signed by its own account's
// cross-signing keys, so clients that share room keys only with verified
// devices (MSC4153) share them with the agent. Call it before the machine
// is handed to the sync loop: it drives the olm machine by itself.
//
//   - The account has no cross-signing keys: with a password, CrossSign
//     makes them, keeps their private halves in secret storage under the
//     recovery key of the recovery key file (a new key, written to the file
//     first, when there is none) and signs the device. Without one, the
//     status says what to configure.
//   - The account has keys and the device is signed: nothing to do, but the
//     recovery key is checked, and a warning logged when it would not sign
//     a new device.
//   - The account has keys and the device is not signed: the recovery key
//     opens secret storage, whose keys sign the device. Without a recovery
//     key file the status says to put the key there; keys made elsewhere
//     are never replaced.
//
// A recovery key that does not open the account's secret storage, or
// storage that does not hold the account's published keys, is ErrRefused:
// no retry helps, the operator must fix the file. No error and no record
// holds the password or the recovery key.
func (m *Machine) CrossSign(ctx context.Context, o CrossSignOptions) (CrossSignStatus, error) {
	m.op.Lock()
	defer m.op.Unlock()
	return m.crossSign(ctx, o)
}

// crossSign is CrossSign, under m.op.
func (m *Machine) crossSign(ctx context.Context, o CrossSignOptions) (CrossSignStatus, error) {
	m.signWith = &o
	if o.RecoveryKeyFile == "" {
		return CrossSignStatus{}, errors.New("cross-signing: no recovery key file is configured")
	}
	now, err := m.standing(ctx)
	if err != nil {
		return CrossSignStatus{}, err
	}
	recovery, haveFile, err := readRecoveryKey(o.RecoveryKeyFile)
	if err != nil {
		return CrossSignStatus{}, err
	}
	switch {
	case now.master == "" && o.Password == "":
		reason := fmt.Sprintf("the account has no cross-signing keys and %s holds no recovery key: "+
			"configure the agent's password, which the homeserver asks for before it takes new cross-signing keys, "+
			"or set up cross-signing in a client such as Element and put the recovery key it shows into that file",
			o.RecoveryKeyFile)
		if haveFile {
			reason = fmt.Sprintf("the account has no cross-signing keys yet: configure the agent's password, "+
				"which the homeserver asks for before it takes new cross-signing keys (the recovery key in %s will guard them)",
				o.RecoveryKeyFile)
		}
		return CrossSignStatus{Reason: reason}, nil
	case now.master == "":
		return m.bootstrap(ctx, o, recovery, haveFile)
	case !haveFile:
		if now.deviceSigned {
			m.log.Warn().Str("recovery_key_file", o.RecoveryKeyFile).
				Msg("The device is cross-signed, but no recovery key file is there: a new device of the agent could not be signed; put the account's recovery key into the file")
			return CrossSignStatus{CrossSigned: true}, nil
		}
		return CrossSignStatus{Reason: fmt.Sprintf("the account's cross-signing keys were made elsewhere (in Element, say) and %s holds no recovery key: "+
			"put the account's recovery key into that file (mode 0600)", o.RecoveryKeyFile)}, nil
	case now.deviceSigned:
		// Signed already; a recovery key that no longer opens secret
		// storage only matters to a future device, so it is worth a
		// warning now, not a refusal to run.
		if err := m.fetchKeys(ctx, o.RecoveryKeyFile, recovery, now); errors.Is(err, ErrRefused) {
			m.log.Warn().Err(err).Str("recovery_key_file", o.RecoveryKeyFile).
				Msg("The device is cross-signed, but the recovery key file could not sign a new device of the agent")
		} else if err != nil {
			return CrossSignStatus{}, err
		}
		return CrossSignStatus{CrossSigned: true}, nil
	}
	if err := m.fetchKeys(ctx, o.RecoveryKeyFile, recovery, now); err != nil {
		return CrossSignStatus{}, err
	}
	if err := m.signDevice(ctx); err != nil {
		return CrossSignStatus{}, err
	}
	m.log.Info().Str("device_id", m.DeviceID()).Msg("Device cross-signed with the keys the recovery key opened")
	return CrossSignStatus{CrossSigned: true}, nil
}

// bootstrap makes the account's cross-signing keys and signs the device.
// Secret storage and the recovery key file come first: once the
// homeserver publishes the keys, a crash must not leave them with no
// recovery key anyone holds. A start after a bootstrap that stopped before
// the upload finds the file and the account still keyless, and bootstraps
// again under the same recovery key.
func (m *Machine) bootstrap(ctx context.Context, o CrossSignOptions, recovery string, haveFile bool) (CrossSignStatus, error) {
	key, err := ssssKey(o.RecoveryKeyFile, recovery, haveFile)
	if err != nil {
		return CrossSignStatus{}, err
	}
	keys, err := m.mach.GenerateCrossSigningKeys()
	if err != nil {
		return CrossSignStatus{}, fmt.Errorf("make cross-signing keys: %w", err)
	}
	if err := m.mach.SSSS.SetKeyData(ctx, key.ID, key.Metadata); err != nil {
		return CrossSignStatus{}, fmt.Errorf("store secret storage key description: %w", err)
	}
	if err := m.mach.SSSS.SetDefaultKeyID(ctx, key.ID); err != nil {
		return CrossSignStatus{}, fmt.Errorf("make the secret storage key the default: %w", err)
	}
	if err := m.mach.UploadCrossSigningKeysToSSSS(ctx, key, keys); err != nil {
		return CrossSignStatus{}, fmt.Errorf("store cross-signing keys in secret storage: %w", err)
	}
	noPasswordStage := false
	err = m.mach.PublishCrossSigningKeys(ctx, keys, func(ui *mautrix.RespUserInteractive) any {
		if !ui.HasSingleStageFlow(mautrix.AuthTypePassword) {
			noPasswordStage = true
			return nil
		}
		return &mautrix.ReqUIAuthLogin{
			BaseAuthData: mautrix.BaseAuthData{Type: mautrix.AuthTypePassword, Session: ui.Session},
			User:         m.self.String(),
			Password:     o.Password,
		}
	})
	if noPasswordStage {
		// A server whose accounts live elsewhere (OIDC, SSO) approves new
		// cross-signing keys there: a person has to set them up.
		return CrossSignStatus{Reason: fmt.Sprintf("the homeserver takes new cross-signing keys only with an authentication other than the password "+
			"(single sign-on, say): set up cross-signing in a client such as Element and put the recovery key it shows into %s, "+
			"in place of the one there", o.RecoveryKeyFile)}, nil
	}
	if err != nil {
		return CrossSignStatus{}, fmt.Errorf("upload cross-signing keys: %w", err)
	}
	if err := m.signDevice(ctx); err != nil {
		return CrossSignStatus{}, err
	}
	m.log.Info().Str("device_id", m.DeviceID()).Str("recovery_key_file", o.RecoveryKeyFile).
		Msg("Cross-signing set up for the account and the device signed; the recovery key file opens the keys in Element too")
	return CrossSignStatus{CrossSigned: true, Bootstrapped: true}, nil
}

// ssssKey is the secret storage key a bootstrap keeps the cross-signing
// keys under: the recovery key file's, or a new one written to a new file.
func ssssKey(path, recovery string, haveFile bool) (*ssss.Key, error) {
	if haveFile {
		raw := utils.DecodeBase58RecoveryKey(recovery)
		if raw == nil {
			return nil, fmt.Errorf("%w: %s does not hold a recovery key", ErrRefused, path)
		}
		// The key's description (its ID, and the MAC by which clients
		// check it) is made anew; the key is what the file holds.
		key, err := ssss.WrapKey(raw, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: %s does not hold a recovery key", ErrRefused, path)
		}
		return key, nil
	}
	key, err := ssss.NewKey("")
	if err != nil {
		return nil, fmt.Errorf("make secret storage key: %w", err)
	}
	if err := writeRecoveryKey(path, key.RecoveryKey()); err != nil {
		return nil, err
	}
	return key, nil
}

// fetchKeys opens the account's secret storage with the recovery key and
// loads the cross-signing keys it holds into the olm machine, if they are
// the ones the account publishes.
func (m *Machine) fetchKeys(ctx context.Context, path, recovery string, now standing) error {
	keyID, meta, err := m.mach.SSSS.GetDefaultKeyData(ctx)
	switch {
	case errors.Is(err, ssss.ErrNoDefaultKeyID), errors.Is(err, mautrix.MNotFound):
		return fmt.Errorf("%w: the account has cross-signing keys but no secret storage the recovery key in %s could open: "+
			"set up secure backup in a client such as Element and put the recovery key it shows into that file", ErrRefused, path)
	case err != nil:
		return fmt.Errorf("read the secret storage key's description: %w", err)
	}
	key, err := meta.VerifyRecoveryKey(keyID, recovery)
	switch {
	case errors.Is(err, ssss.ErrUnverifiableKey):
		// The description carries no MAC to check the key by; decrypting
		// the keys below checks it instead.
	case errors.Is(err, ssss.ErrInvalidRecoveryKey):
		return fmt.Errorf("%w: %s does not hold a recovery key", ErrRefused, path)
	case err != nil:
		return fmt.Errorf("%w: the recovery key in %s does not open the account's secret storage (%w): put the account's current recovery key there",
			ErrRefused, path, err)
	}
	err = m.mach.FetchCrossSigningKeysFromSSSS(ctx, key)
	switch {
	case errors.Is(err, mautrix.MNotFound), errors.Is(err, ssss.ErrNotEncryptedForKey):
		return fmt.Errorf("%w: the account's secret storage holds no cross-signing keys under the recovery key in %s", ErrRefused, path)
	case errors.Is(err, ssss.ErrKeyDataMACMismatch):
		return fmt.Errorf("%w: the recovery key in %s does not open the account's secret storage: put the account's current recovery key there",
			ErrRefused, path)
	case err != nil:
		return fmt.Errorf("read cross-signing keys from secret storage: %w", err)
	}
	// Dendrite takes a signature by any key, so a self-signing key the
	// account does not publish would leave the device unsigned unnoticed.
	if pub := m.mach.CrossSigningKeys.PublicKeys(); pub.MasterKey != now.master || pub.SelfSigningKey != now.selfSigning {
		return fmt.Errorf("%w: the account's secret storage holds other cross-signing keys than the account publishes "+
			"(they were reset without it): reset cross-signing in a client such as Element and put the new recovery key into %s", ErrRefused, path)
	}
	return nil
}

// signDevice signs the device with the loaded self-signing key, and the
// master key with the device (as Element does, so the device trusts its
// account's keys), then checks that the homeserver publishes the device
// as cross-signed.
func (m *Machine) signDevice(ctx context.Context) error {
	if err := m.mach.SignOwnDevice(ctx, m.mach.OwnIdentity()); err != nil {
		return fmt.Errorf("sign the device with the self-signing key: %w", err)
	}
	if err := m.mach.SignOwnMasterKey(ctx); err != nil {
		return fmt.Errorf("sign the master key with the device: %w", err)
	}
	now, err := m.standing(ctx)
	if err != nil {
		return err
	}
	if !now.deviceSigned {
		return fmt.Errorf("the homeserver took the signature of device %s but does not publish it", m.DeviceID())
	}
	return nil
}

// standing is the account's cross-signing as the homeserver publishes it.
type standing struct {
	// master and selfSigning are the account's public keys, "" for none.
	master, selfSigning id.Ed25519
	// deviceSigned is whether the device carries a valid signature of the
	// self-signing key, which carries one of the master key.
	deviceSigned bool
}

// standing reads the account's cross-signing keys and the device's keys
// from the homeserver. The objects are checked as the server sent them:
// a signature covers every field, including any mautrix's structs drop.
func (m *Machine) standing(ctx context.Context) (standing, error) {
	device := m.mach.Client.DeviceID
	var resp struct {
		DeviceKeys      map[id.UserID]map[id.DeviceID]json.RawMessage `json:"device_keys"`
		MasterKeys      map[id.UserID]json.RawMessage                 `json:"master_keys"`
		SelfSigningKeys map[id.UserID]json.RawMessage                 `json:"self_signing_keys"`
	}
	req := map[string]any{"device_keys": map[id.UserID][]id.DeviceID{m.self: {device}}}
	if _, err := m.mach.Client.MakeRequest(ctx, http.MethodPost, m.mach.Client.BuildClientURL("v3", "keys", "query"), req, &resp); err != nil {
		return standing{}, fmt.Errorf("query own cross-signing keys: %w", err)
	}
	var s standing
	var err error
	if s.master, err = crossSigningKey(resp.MasterKeys[m.self], id.XSUsageMaster); err != nil || s.master == "" {
		return s, err
	}
	selfSigning := resp.SelfSigningKeys[m.self]
	if s.selfSigning, err = crossSigningKey(selfSigning, id.XSUsageSelfSigning); err != nil || s.selfSigning == "" {
		return s, err
	}
	s.deviceSigned = signedBy(selfSigning, m.self, s.master) && signedBy(resp.DeviceKeys[m.self][device], m.self, s.selfSigning)
	return s, nil
}

// crossSigningKey is the public key of a published cross-signing key
// with usage, "" when there is none. A malformed one is an error, not
// none: taking it for none would have a bootstrap replace the account's
// keys.
func crossSigningKey(raw json.RawMessage, usage id.CrossSigningUsage) (id.Ed25519, error) {
	if raw == nil {
		return "", nil
	}
	var key mautrix.CrossSigningKeys
	if err := json.Unmarshal(raw, &key); err != nil {
		return "", fmt.Errorf("read the account's published %s key: %w", usage, err)
	}
	pub := key.FirstKey()
	if len(key.Keys) != 1 || pub == "" {
		return "", fmt.Errorf("the account's published %s key holds %d keys, not one", usage, len(key.Keys))
	}
	return pub, nil
}

// signedBy reports whether the signed JSON object raw carries a valid
// signature of user's key. A missing object, a missing signature and a
// bad one alike mean not signed.
func signedBy(raw json.RawMessage, user id.UserID, key id.Ed25519) bool {
	if raw == nil {
		return false
	}
	ok, err := signatures.VerifySignatureJSON(raw, user, key.String(), key)
	return ok && err == nil
}

// readRecoveryKey reads the recovery key file: its words joined by single
// spaces (the form Element shows), and whether the file is there.
func readRecoveryKey(path string) (string, bool, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read recovery key file: %w", err)
	}
	return strings.Join(strings.Fields(string(data)), " "), true, nil
}

// writeRecoveryKey writes a new recovery key file, 0600, whole or not at
// all, and never over a file that is there: one made meanwhile may hold
// the key of keys already in use.
func writeRecoveryKey(path, recovery string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("recovery key directory: %w", err)
	}
	// CreateTemp makes the file 0600.
	tmp, err := os.CreateTemp(dir, ".recovery-key-*")
	if err != nil {
		return fmt.Errorf("write recovery key file: %w", err)
	}
	defer os.Remove(tmp.Name()) // the new name stays once linked
	if _, err := tmp.WriteString(recovery + "\n"); err != nil {
		tmp.Close()
		return fmt.Errorf("write recovery key file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write recovery key file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write recovery key file: %w", err)
	}
	// A hard link puts the file in place atomically, as a rename would,
	// but fails instead of replacing a file of that name.
	if err := os.Link(tmp.Name(), path); err != nil {
		return fmt.Errorf("write recovery key file: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write recovery key file: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write recovery key file: %w", err)
	}
	return nil
}
