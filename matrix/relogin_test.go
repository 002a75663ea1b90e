package matrix_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
)

// owedReply is one reply in a journal on an on-disk SQLite file, owed to
// room, with an outbox actor to deliver it.
type owedReply struct {
	t     *testing.T
	store *store.Store
	view  journal.PrincipalStore
	acked chan journal.Delivery
}

const owedBody = "the owed answer"

func newOwedReply(t *testing.T, c *matrix.Client, room string) *owedReply {
	t.Helper()
	s, _ := testsupport.MustOpen(t)
	v, err := s.Principal(t.Context(), "bot", c.UserID())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.EnqueueAndSettle(t.Context(), journal.EnqueueRequest{
		DeliveryID: "reply-1", Stage: journal.StageFinal, RoomID: room,
		Content: json.RawMessage(`{"msgtype":"m.text","body":"` + owedBody + `"}`),
	}); err != nil {
		t.Fatal(err)
	}
	return &owedReply{t: t, store: s, view: v, acked: make(chan journal.Delivery, 1)}
}

// deliver starts an outbox actor sending through c; it is stopped when the
// test ends.
func (o *owedReply) deliver(c *matrix.Client) func() {
	o.t.Helper()
	sys := actors.NewSystem(zerolog.Nop())
	sub := o.store.Hints().Subscribe(o.view.Principal().String())
	pid := sys.Root.Spawn(outbox.Props(outbox.Deps{
		Outbox: o.view, Sender: matrix.NewSender(c), Reconciler: matrix.NewReconciler(c), DeviceID: c.DeviceID(),
		Hints: sub, Log: zerolog.New(zerolog.NewTestWriter(o.t)),
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, SettleDelay: 500 * time.Millisecond,
		Observe: func(p outbox.Point, d journal.Delivery) {
			if p == outbox.Acknowledged {
				o.acked <- d
			}
		},
	}))
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			if err := sys.Root.StopFuture(pid).Wait(); err != nil {
				o.t.Errorf("stop outbox actor: %v", err)
			}
			sub.Close()
		}
	}
	o.t.Cleanup(stop)
	return stop
}

// awaitAcknowledged waits for the reply's acknowledgement and returns its
// event ID.
func (o *owedReply) awaitAcknowledged() string {
	o.t.Helper()
	select {
	case <-o.acked:
	case <-time.After(60 * time.Second):
		o.t.Fatalf("the owed reply was never acknowledged; the row is %+v", o.row())
	}
	row := o.row()
	if row.State != journal.DeliveryAcknowledged {
		o.t.Fatalf("row %v after its acknowledgement", row.State)
	}
	return row.EventID
}

func (o *owedReply) row() journal.Delivery {
	o.t.Helper()
	d, err := o.view.Delivery(o.t.Context(), "reply-1", journal.StageFinal)
	if err != nil {
		o.t.Fatal(err)
	}
	return d
}

// The bot's session is signed out (its device logged out, as a password
// reset does) while a reply is owed: the refused send logs in again with
// the password on the same device, and the reply goes out once.
func TestAReplyOwedWhenTheSessionIsSignedOutGoesOutOnceAfterTheReLogin(t *testing.T) {
	acct := register(t)
	cfg := config(t, acct)
	c := login(t, cfg)
	human, room := roomWithBot(t, c)
	device := c.DeviceID()
	_, _, revoked := storedSession(t, cfg)
	logout(t, revoked)

	o := newOwedReply(t, c, room)
	o.deliver(c)
	eventID := o.awaitAcknowledged()

	if n := countBodies(t, history(t, human, room, eventID), owedBody); n != 1 {
		t.Errorf("the room shows the reply %d times, want once", n)
	}
	if c.DeviceID() != device {
		t.Errorf("device %s after the re-login, want %s", c.DeviceID(), device)
	}
	_, stored, token := storedSession(t, cfg)
	if stored != device || token == revoked || token == "" {
		t.Errorf("session file: device %s, token replaced: %t; want %s and a new token", stored, token != revoked, device)
	}
	// The kept session is the live one: a restart reuses it.
	if _, dev, err := login(t, cfg).WhoAmI(t.Context()); err != nil || dev != device {
		t.Errorf("whoami after a restart = %s, %v; want %s", dev, err, device)
	}
}

// Without a password nothing can log in again: the refused reply stays owed
// (never failed for good), and once the daemon runs with a valid token for
// the device, it goes out once.
func TestWithoutAPasswordARefusedReplyStaysOwedUntilAValidTokenSendsItOnce(t *testing.T) {
	acct := register(t)
	withPassword := config(t, acct)
	c := login(t, withPassword)
	human, room := roomWithBot(t, c)
	_, device, revoked := storedSession(t, withPassword)
	tokenOnly := matrix.Config{Homeserver: hs.URL, UserID: acct.UserID, AccessToken: revoked, Agent: "bot",
		StorageDir: t.TempDir(), Log: zerolog.New(zerolog.NewTestWriter(t))}
	bot := login(t, tokenOnly)
	logout(t, revoked)
	if _, _, err := bot.WhoAmI(t.Context()); !errors.Is(err, matrix.ErrInvalidToken) {
		t.Fatalf("whoami with a revoked token and no password: %v, want ErrInvalidToken", err)
	}

	o := newOwedReply(t, bot, room)
	stop := o.deliver(bot)
	// Retried with backoff, each refusal recorded on the row, which stays
	// attempted.
	deadline := time.Now().Add(60 * time.Second)
	for o.row().Attempts < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the refused reply was not retried: %+v", o.row())
		}
		time.Sleep(20 * time.Millisecond) // polling the row's recorded attempts
	}
	stop()
	if row := o.row(); row.State != journal.DeliveryAttempted || !strings.Contains(row.LastError, "401") {
		t.Fatalf("refused row: %v, last error %q; want it attempted and owed, the 401 recorded", row.State, row.LastError)
	}

	// The operator logs the device in again and configures the new token.
	again := login(t, withPassword)
	if again.DeviceID() != device {
		t.Fatalf("device %s after the new login, want %s", again.DeviceID(), device)
	}
	_, _, fresh := storedSession(t, withPassword)
	tokenOnly.AccessToken = fresh
	restarted := login(t, tokenOnly)
	o.deliver(restarted)
	eventID := o.awaitAcknowledged()
	if n := countBodies(t, history(t, human, room, eventID), owedBody); n != 1 {
		t.Errorf("the room shows the reply %d times, want once", n)
	}
}
