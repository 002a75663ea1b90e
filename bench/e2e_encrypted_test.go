package bench

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix/crypto"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

// BenchmarkEndToEndEncrypted is BenchmarkEndToEnd in encrypted rooms: on a
// real Dendrite on loopback, the time from a person's encrypted send
// (e2eeperson, a device and crypto of its own) to the agent's encrypted
// answer arriving, decrypted, in the person's own sync. The journaled side
// is the agent as the daemon wires it: the journal, the principal and the
// agent's e2ee.Machine with its crypto store beside the journal. The floor
// is the same person in a second encrypted room with a bare client on the
// daemon's own transport that decrypts each message as its sync delivers
// it and sends the echo encrypted, with its olm account and sessions in
// memory (memCrypto): it stores nothing. It is not a second e2eeperson,
// whose every send first reads the room's state and queries the members'
// devices, two requests the daemon's send does not make, which would slow
// the floor and flatter the ratio (bench/README.md). Each room holds the
// person and its answerer alone, so the person's sends cost the same on
// both sides.
//
// Dendrite's speed drifts within minutes, so each iteration is one pair, a
// round of each side back to back in alternating order, and the ratio is
// the median of the pairs' p50 ratios.
//
// Metrics: e2e-p50-ms, e2e-p99-ms, floor-p50-ms, floor-p99-ms over every
// message of the run; e2e/floor, the median per-pair ratio of p50s, with
// ratio-min and ratio-max, the pairs' extremes; p50-diff-ms, the e2e p50
// less the floor's; send-p50-ms, the median time the person's send itself
// took (inside both round trips alike).
func BenchmarkEndToEndEncrypted(b *testing.B) {
	perRound, warmup := 70, 5
	if testing.Short() {
		perRound, warmup = 5, 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hs := dendrite.Start(b)
	alice := e2eeperson.New(b, hs, hs.Register(b, "alice", "alice-password"))
	botAcct := hs.Register(b, "bot", "bot-password")
	bareAcct := hs.Register(b, "bare", "bare-password")

	startEncryptedAgent(b, ctx, hs.URL, botAcct)

	// The floor's bare client.
	bare, err := matrix.Login(ctx, matrix.Config{Homeserver: hs.URL, UserID: bareAcct.UserID, Password: bareAcct.Password,
		Agent: "bare", StorageDir: b.TempDir(), Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	bareCrypto, err := newMemCrypto(ctx, bare)
	if err != nil {
		b.Fatal(err)
	}
	defer bareCrypto.close()
	bare.SetEncrypter(bareCrypto)

	journaled := alice.CreateEncryptedRoom(botAcct.UserID)
	floorRoom := alice.CreateEncryptedRoom(bareAcct.UserID)
	if _, err := bare.Join(ctx, floorRoom); err != nil {
		b.Fatal(err)
	}
	// A message sent before an answerer's first sync in the room would be
	// history to it, never answered: wait for the agent's join and the
	// bare loop's first sync.
	joined, cancelJoin := context.WithTimeout(ctx, time.Minute)
	alice.AwaitDecrypted(joined, journaled, joinOf(botAcct.UserID))
	cancelJoin()
	bareCtx, stopBare := context.WithCancel(ctx)
	ready, bareDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(bareDone)
		// The last echo may still be in flight when the benchmark ends
		// (the person's sync can show it before the send returns): an
		// error once the loop is stopped is no failure.
		if err := bareEncryptedEcho(bareCtx, bare, bareCrypto, floorRoom, alice.UserID(), ready); err != nil && bareCtx.Err() == nil {
			// Error, unlike Fatal, may be called from here; the awaits
			// below fail at once on the cancelled context.
			b.Errorf("the bare client stopped: %v", err)
			cancel()
		}
	}()
	defer func() { stopBare(); <-bareDone }()
	select {
	case <-ready:
	case <-bareDone:
		b.FailNow()
	}

	seq := 0
	var sends []time.Duration
	round := func(room, answerer string, n int) []time.Duration {
		out := make([]time.Duration, 0, n)
		for range n {
			seq++
			text := "ping " + strconv.Itoa(seq)
			start := time.Now()
			alice.SendText(room, text)
			sends = append(sends, time.Since(start))
			wait, cancelWait := context.WithTimeout(ctx, time.Minute)
			alice.AwaitDecrypted(wait, room, encryptedEcho(answerer, text))
			cancelWait()
			out = append(out, time.Since(start))
		}
		return out
	}
	// The first messages pay for olm sessions, room keys and prepared
	// statements on both sides.
	round(journaled, botAcct.UserID, warmup)
	round(floorRoom, bareAcct.UserID, warmup)
	sends = sends[:0]

	var e2eAll, floorAll []time.Duration
	var ratios []float64
	b.ResetTimer()
	for i := range b.N {
		var e2e, floor []time.Duration
		if i%2 == 0 {
			e2e = round(journaled, botAcct.UserID, perRound)
			floor = round(floorRoom, bareAcct.UserID, perRound)
		} else {
			floor = round(floorRoom, bareAcct.UserID, perRound)
			e2e = round(journaled, botAcct.UserID, perRound)
		}
		e2eAll, floorAll = append(e2eAll, e2e...), append(floorAll, floor...)
		ratios = append(ratios, float64(quantile(e2e, 0.5))/float64(quantile(floor, 0.5)))
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(quantile(e2eAll, 0.5)), "e2e-p50-ms")
	b.ReportMetric(ms(quantile(e2eAll, 0.99)), "e2e-p99-ms")
	b.ReportMetric(ms(quantile(floorAll, 0.5)), "floor-p50-ms")
	b.ReportMetric(ms(quantile(floorAll, 0.99)), "floor-p99-ms")
	b.ReportMetric(median(ratios), "e2e/floor")
	b.ReportMetric(slices.Min(ratios), "ratio-min")
	b.ReportMetric(slices.Max(ratios), "ratio-max")
	b.ReportMetric(ms(quantile(e2eAll, 0.5)-quantile(floorAll, 0.5)), "p50-diff-ms")
	b.ReportMetric(ms(quantile(sends, 0.5)), "send-p50-ms")
	b.ReportMetric(float64(len(e2eAll)), "messages")
}

// startEncryptedAgent runs the echo agent of acct as the daemon runs it in
// an encrypted room, until the benchmark ends: a journal, the account's
// e2ee.Machine with its crypto store and pickle key beside the journal,
// the machine sealing every send, and the principal taking each sync's
// device news and decrypting its events before admission.
func startEncryptedAgent(b *testing.B, ctx context.Context, homeserver string, acct dendrite.Account) {
	b.Helper()
	dir := b.TempDir()
	s, err := store.Open(ctx, store.Options{StorageDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	view, err := s.Principal(ctx, "echo", acct.UserID)
	if err != nil {
		b.Fatal(err)
	}
	client, err := matrix.Login(ctx, matrix.Config{Homeserver: homeserver, UserID: acct.UserID, Password: acct.Password,
		Agent: "echo", StorageDir: dir, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	machine := openMachine(b, ctx, dir, view.Principal().String(), client)
	client.SetEncrypter(machine)
	reconciler := matrix.NewReconciler(client)
	reconciler.Open = machine.Open
	system := actors.NewSystem(zerolog.Nop())
	pid := system.Root.Spawn(principal.Props(principal.Deps{
		Store: view, Transport: client, Agent: agent.AgentFunc(echoAnswer),
		Sender: matrix.NewSender(client), Reconciler: reconciler, DeviceID: client.DeviceID(),
		Hints: s.Hints(), AutoJoin: true, Crypto: machine, Log: zerolog.Nop(),
	}))
	b.Cleanup(func() { _ = system.Root.StopFuture(pid).Wait() })
}

// openMachine opens the crypto store in dir, with a pickle key generated
// there, and the olm machine of account on client's device, as the
// daemon's start does; both close when the benchmark ends.
func openMachine(b *testing.B, ctx context.Context, dir, account string, client *matrix.Client) *e2ee.Machine {
	b.Helper()
	pickle, err := e2ee.LoadPickleKey(filepath.Join(dir, "pickle.key"))
	if err != nil {
		b.Fatal(err)
	}
	keys, err := e2ee.OpenSQLite(ctx, filepath.Join(dir, e2ee.FileName))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { keys.Close() })
	machine, err := keys.Machine(ctx, e2ee.Options{Account: account, Client: client, PickleKey: pickle, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(machine.Close)
	return machine
}

// bareEncryptedEcho is the floor's agent: a sync loop that hands each
// sync's device news to its crypto, then decrypts each of the person's
// messages in room as it arrives and sends the echo, sealed by the
// client's Encrypter (mc). A message whose room key has not come yet (the
// server may deliver the key's to-device message a sync after the event)
// is tried again after each later sync, as the daemon resolves one when
// its key comes. It closes ready after its first sync, whose events are
// history and not answered, and stores nothing. It runs until ctx ends,
// and then returns nil or the error of the request ctx cut short.
func bareEncryptedEcho(ctx context.Context, c *matrix.Client, mc *memCrypto, room, person string, ready chan<- struct{}) error {
	since := ""
	txn := 0
	var waiting []json.RawMessage
	for ctx.Err() == nil {
		batch, err := c.Sync(ctx, since, 30*time.Second)
		if err != nil {
			return err
		}
		mc.process(ctx, since, batch)
		if since == "" {
			close(ready)
		} else {
			for _, r := range batch.Joined {
				if r.RoomID != room {
					continue
				}
				for _, raw := range r.Events {
					if senderOf(raw) == person && typeOf(raw) == "m.room.encrypted" {
						waiting = append(waiting, raw)
					}
				}
			}
			var keyless []json.RawMessage
			for _, raw := range waiting {
				clear, err := mc.decrypt(ctx, room, raw)
				if errors.Is(err, crypto.ErrNoSessionFound) {
					keyless = append(keyless, raw)
					continue
				}
				if err != nil {
					return err
				}
				txn++
				content, _ := json.Marshal(map[string]string{"msgtype": "m.text", "body": "echo: " + contentBody(clear)})
				if _, err := c.Send(ctx, room, "m.room.message", "bare-"+strconv.Itoa(txn), content); err != nil {
					return err
				}
			}
			waiting = keyless
		}
		since = batch.NextBatch
	}
	return nil
}

// encryptedEcho matches answerer's echo of text, sent encrypted. The body
// is compared first: the person's timeline is scanned whole at each wake.
func encryptedEcho(answerer, text string) func(string, map[string]any, json.RawMessage) bool {
	want := "echo: " + text
	return func(_ string, content map[string]any, raw json.RawMessage) bool {
		return content["body"] == want && senderOf(raw) == answerer && typeOf(raw) == "m.room.encrypted"
	}
}

// joinOf matches user's join.
func joinOf(user string) func(string, map[string]any, json.RawMessage) bool {
	return func(typ string, content map[string]any, raw json.RawMessage) bool {
		var ev struct {
			StateKey string `json:"state_key"`
		}
		return typ == "m.room.member" && content["membership"] == "join" &&
			json.Unmarshal(raw, &ev) == nil && ev.StateKey == user
	}
}

func typeOf(raw json.RawMessage) string {
	var ev struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &ev)
	return ev.Type
}

// contentBody is the body of an event content.
func contentBody(content json.RawMessage) string {
	var c struct {
		Body string `json:"body"`
	}
	_ = json.Unmarshal(content, &c)
	return c.Body
}
