package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// encryptedBatch is the events of one admission: a sync bringing a
// room's worth of news. It is also the messages one megolm session
// encrypts before it rotates (the default rotation_period_msgs), so each
// encrypted batch is one session of its own, as 100 messages of one
// sender in a busy room would be.
const encryptedBatch = 100

// BenchmarkAdmitEncrypted measures what decryption adds to admission:
// batches of 100 encrypted messages, each decrypted by the agent's real
// e2ee.Machine and then admitted with one AdmitBatch, against batches of
// 100 clear messages with the same bodies admitted into the same room
// through the same view of the same on-disk store (SQLite at its defaults,
// in a temporary directory, the crypto store beside it), in alternating
// order. Only the timing is in the comparison: that every event decrypted
// is checked after it.
//
// The ciphertext is real megolm: a sender's olm machine (memCrypto, over
// a second account on Dendrite) starts an outbound session per batch and
// shares its key with the agent's device over olm to-device, and the
// agent's sync loop takes it through e2ee.Machine.ProcessSync, as the
// daemon's does; untimed, as it comes once per session. The sender then
// encrypts the batch's messages locally, each wrapped in an
// m.room.encrypted event with a fresh event ID, so the batch needs no
// round trip to the server and every decryption is a first one (a new
// message index for the replay check). Decryption runs in the loop:
// the timed encrypted side is Decrypt of each event, then AdmitBatch.
//
// Metrics: encrypted-ns/event and clear-ns/event over the run;
// decrypt-ns/event, the Decrypt calls alone; enc/clear, the median of the
// iterations' ratios, with ratio-min and ratio-max, their extremes.
func BenchmarkAdmitEncrypted(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hs := dendrite.Start(b)
	botAcct := hs.Register(b, "bot", "bot-password")
	senderAcct := hs.Register(b, "sender", "sender-password")

	dir := b.TempDir()
	s, err := store.Open(ctx, store.Options{StorageDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	view, err := s.Principal(ctx, "bot", botAcct.UserID)
	if err != nil {
		b.Fatal(err)
	}
	bot, err := matrix.Login(ctx, matrix.Config{Homeserver: hs.URL, UserID: botAcct.UserID, Password: botAcct.Password,
		Agent: "bot", StorageDir: dir, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	machine := openMachine(b, ctx, dir, view.Principal().String(), bot)
	sender, err := matrix.Login(ctx, matrix.Config{Homeserver: hs.URL, UserID: senderAcct.UserID, Password: senderAcct.Password,
		Agent: "sender", StorageDir: b.TempDir(), Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	senderCrypto, err := newMemCrypto(ctx, sender)
	if err != nil {
		b.Fatal(err)
	}
	defer senderCrypto.close()

	src := &encryptedSource{
		bot: bot, machine: machine, sender: senderCrypto, senderID: senderAcct.UserID, botID: id.UserID(botAcct.UserID),
		room: "!encrypted:" + benchServer, g: newGen(uint64(time.Now().UnixNano()), 11), ts: time.Now().UnixMilli(),
	}
	admit := func(in []journal.Inbound, token string) {
		res, err := view.AdmitBatch(ctx, in, token)
		if err != nil {
			b.Fatal(err)
		}
		for i, r := range res {
			if r.Outcome != journal.Admitted {
				b.Fatalf("event %d of batch %s: %v %v", i, token, r.Outcome, r.Err)
			}
		}
	}
	var enc, plain, decrypt time.Duration
	var ratios []float64
	batch := 0
	iteration := func() (encTook, clearTook, decryptTook time.Duration) {
		encrypted, clearIn := src.next(b, ctx)
		batch++
		timeEncrypted := func() {
			start := time.Now()
			for i := range encrypted {
				encrypted[i] = machine.Decrypt(ctx, encrypted[i])
			}
			decryptTook = time.Since(start)
			admit(encrypted, fmt.Sprintf("enc%d", batch))
			encTook = time.Since(start)
		}
		timeClear := func() {
			start := time.Now()
			admit(clearIn, fmt.Sprintf("clear%d", batch))
			clearTook = time.Since(start)
		}
		if batch%2 == 0 {
			timeEncrypted()
			timeClear()
		} else {
			timeClear()
			timeEncrypted()
		}
		for _, in := range encrypted {
			if in.AwaitingSession != "" || in.Undecryptable != "" || typeOf(in.Event) != "m.room.message" {
				b.Fatalf("an event did not decrypt: awaiting %q, undecryptable %q", in.AwaitingSession, in.Undecryptable)
			}
		}
		return encTook, clearTook, decryptTook
	}
	// The first batch pays for the sender's device keys, the olm session
	// and prepared statements.
	iteration()
	b.ResetTimer()
	for range b.N {
		e, c, d := iteration()
		enc, plain, decrypt = enc+e, plain+c, decrypt+d
		ratios = append(ratios, float64(e)/float64(c))
	}
	b.StopTimer()
	perEvent := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*encryptedBatch) }
	b.ReportMetric(perEvent(enc), "encrypted-ns/event")
	b.ReportMetric(perEvent(plain), "clear-ns/event")
	b.ReportMetric(perEvent(decrypt), "decrypt-ns/event")
	b.ReportMetric(median(ratios), "enc/clear")
	b.ReportMetric(slices.Min(ratios), "ratio-min")
	b.ReportMetric(slices.Max(ratios), "ratio-max")
}

// encryptedSource makes the batches of BenchmarkAdmitEncrypted.
type encryptedSource struct {
	bot      *matrix.Client
	machine  *e2ee.Machine
	sender   *memCrypto
	senderID string
	botID    id.UserID
	room     string
	g        *gen
	ts       int64
	// since is the agent's sync token.
	since string
}

// next returns encryptedBatch encrypted messages, under a session whose
// key the agent's machine holds, and as many clear messages with the same
// bodies. Both are new events, and newer than any before them.
func (s *encryptedSource) next(b *testing.B, ctx context.Context) (encrypted, plain []journal.Inbound) {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	rid := id.RoomID(s.room)
	// The last batch used its session up (or there was none yet): this
	// starts a new one and shares its key.
	if err := s.sender.mach.ShareGroupSession(ctx, rid, []id.UserID{s.botID}); err != nil {
		b.Fatal(err)
	}
	session, err := s.sender.mach.CryptoStore.GetOutboundGroupSession(ctx, rid)
	if err != nil {
		b.Fatal(err)
	}
	if session.MaxMessages != encryptedBatch {
		b.Fatalf("sessions rotate after %d messages, not after a batch of %d", session.MaxMessages, encryptedBatch)
	}
	s.awaitKey(b, ctx, session.ID().String())
	for range encryptedBatch {
		s.ts++
		body := s.g.body()
		sealed, err := s.sender.mach.EncryptMegolmEvent(ctx, rid, event.EventMessage,
			map[string]string{"msgtype": "m.text", "body": body})
		if err != nil {
			b.Fatal(err)
		}
		raw, err := json.Marshal(map[string]any{"event_id": s.g.eventID(), "type": "m.room.encrypted",
			"sender": s.senderID, "origin_server_ts": s.ts, "content": sealed})
		if err != nil {
			b.Fatal(err)
		}
		encrypted = append(encrypted, journal.Inbound{RoomID: s.room, Provenance: journal.Live, Event: raw})
		plain = append(plain, journal.Inbound{RoomID: s.room, Provenance: journal.Live,
			Event: mx.Message(s.g.eventID(), s.senderID, s.ts, body).JSON()})
	}
	return encrypted, plain
}

// awaitKey runs the agent's sync until its machine has stored the megolm
// session, as the principal's sync loop would.
func (s *encryptedSource) awaitKey(b *testing.B, ctx context.Context, session string) {
	b.Helper()
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		batch, err := s.bot.Sync(wait, s.since, 30*time.Second)
		if err != nil {
			b.Fatalf("the room key of session %s did not come: %v", session, err)
		}
		if err := s.machine.ProcessSync(wait, s.since, batch); err != nil {
			b.Fatal(err)
		}
		s.since = batch.NextBatch
		if slices.ContainsFunc(s.machine.TakeReceived(), func(w journal.KeyWait) bool { return w.Session == session }) {
			return
		}
	}
}
