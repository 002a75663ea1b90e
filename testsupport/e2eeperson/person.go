package e2eeperson

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// Person is a Client bound to a test. Its helpers fail the test on any
// error, so a test reads as the conversation it plays; they must be called
// from that test's goroutine. Requests are bounded by the test's context;
// the sync loop runs until the test ends.
type Person struct {
	tb testing.TB
	c  *Client
}

// New logs acct's user in on a new device, creates its Olm account,
// uploads the device keys and one-time keys, and starts the sync loop,
// stopped when the test ends. It returns after the first sync has been
// processed.
func New(tb testing.TB, s *dendrite.Server, acct dendrite.Account) *Person {
	tb.Helper()
	c, err := Open(tb.Context(), s.URL, acct)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return &Person{tb: tb, c: c}
}

// must returns the ID an operation returned, or fails the test with its
// error.
func (p *Person) must(id string, err error) string {
	p.tb.Helper()
	check(p.tb, err)
	return id
}

// check fails tb with err, if any.
func check(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// UserID is the person's full Matrix user ID.
func (p *Person) UserID() string { return p.c.UserID() }

// DeviceID is the ID of the person's own device.
func (p *Person) DeviceID() string { return p.c.DeviceID() }

// CreateEncryptedRoom is Client.CreateEncryptedRoom.
func (p *Person) CreateEncryptedRoom(invite ...string) string {
	p.tb.Helper()
	return p.must(p.c.CreateEncryptedRoom(p.tb.Context(), invite...))
}

// Invite invites user to room.
func (p *Person) Invite(room, user string) {
	p.tb.Helper()
	check(p.tb, p.c.Invite(p.tb.Context(), room, user))
}

// Join joins room.
func (p *Person) Join(room string) {
	p.tb.Helper()
	check(p.tb, p.c.Join(p.tb.Context(), room))
}

// Kick is Client.Kick.
func (p *Person) Kick(room, user string) {
	p.tb.Helper()
	check(p.tb, p.c.Kick(p.tb.Context(), room, user))
}

// Redact is Client.Redact.
func (p *Person) Redact(room, target string) string {
	p.tb.Helper()
	return p.must(p.c.Redact(p.tb.Context(), room, target))
}

// SendText sends an encrypted plain text message and returns its event ID.
func (p *Person) SendText(room, body string) string {
	p.tb.Helper()
	return p.must(p.c.SendText(p.tb.Context(), room, body))
}

// Edit is Client.Edit.
func (p *Person) Edit(room, target, body string) string {
	p.tb.Helper()
	return p.must(p.c.Edit(p.tb.Context(), room, target, body))
}

// ThreadReply is Client.ThreadReply.
func (p *Person) ThreadReply(room, root, body string) string {
	p.tb.Helper()
	return p.must(p.c.ThreadReply(p.tb.Context(), room, root, body))
}

// SendTextWithheldFrom is Client.SendTextWithheldFrom.
func (p *Person) SendTextWithheldFrom(room, body, user string) string {
	p.tb.Helper()
	return p.must(p.c.SendTextWithheldFrom(p.tb.Context(), room, body, user))
}

// ShareWithheldKeys is Client.ShareWithheldKeys; a room with no withheld
// message fails the test.
func (p *Person) ShareWithheldKeys(room string) {
	p.tb.Helper()
	check(p.tb, p.c.ShareWithheldKeys(p.tb.Context(), room))
}

// AwaitDecrypted returns the ID and content of the event
// Client.AwaitDecrypted returns; ctx ending fails the test.
func (p *Person) AwaitDecrypted(ctx context.Context, room string, match func(evType string, content map[string]any, raw json.RawMessage) bool) (eventID string, content map[string]any) {
	p.tb.Helper()
	d, err := p.c.AwaitDecrypted(ctx, room, match)
	check(p.tb, err)
	return d.EventID, d.Content
}

// Decrypt is Client.Decrypt; ctx ending fails the test.
func (p *Person) Decrypt(ctx context.Context, room, eventID string) Decrypted {
	p.tb.Helper()
	d, err := p.c.Decrypt(ctx, room, eventID)
	check(p.tb, err)
	return d
}

// DecryptedTimeline is Client.DecryptedTimeline.
func (p *Person) DecryptedTimeline(room string) []Decrypted {
	p.tb.Helper()
	return p.c.DecryptedTimeline(p.tb.Context(), room)
}

// DeviceIsCrossSigned is Client.DeviceIsCrossSigned.
func (p *Person) DeviceIsCrossSigned(ctx context.Context, userID, deviceID string) (bool, error) {
	return p.c.DeviceIsCrossSigned(ctx, userID, deviceID)
}

// CrossSignOwnDevice is Client.CrossSignOwnDevice.
func (p *Person) CrossSignOwnDevice() {
	p.tb.Helper()
	check(p.tb, p.c.CrossSignOwnDevice(p.tb.Context()))
}
