package contract

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// session is the megolm session the suite's ciphertexts wait on.
const session = "sessionA"

// awaitingIn is ciphertext of room admitted before its key came.
func awaitingIn(e event, prov journal.Provenance) journal.Inbound {
	in := e.In(room, prov)
	in.AwaitingSession = session
	return in
}

// cleartext is the decrypted form of an encrypted event: the outer
// event's identity, the inner event's type and content.
func cleartext(inner event, prov journal.Provenance) journal.Inbound {
	return inner.In(room, prov)
}

// resolve installs clear for the awaiting event eventID and returns what
// resolving did.
func (fx *fixture) resolve(v journal.PrincipalStore, eventID string, clear journal.Inbound) journal.KeyOutcome {
	fx.t.Helper()
	ctx := context.Background()
	waiting, err := v.AwaitingFor(ctx, room, session, 100)
	if err != nil {
		fx.t.Fatalf("AwaitingFor: %v", err)
	}
	seq := int64(-1)
	for _, w := range waiting {
		if w.EventID == eventID {
			seq = w.Seq
		}
	}
	if seq < 0 {
		// Resolving an event that waits no more must change nothing: a
		// position the journal holds for another event proves it.
		seq = 1
	}
	out, err := v.ResolveAwaiting(ctx, seq, clear)
	if err != nil {
		fx.t.Fatalf("ResolveAwaiting(%s): %v", eventID, err)
	}
	return out
}

// awaitingIDs lists the events of room waiting on the suite's session.
func (fx *fixture) awaitingIDs(v journal.PrincipalStore) []string {
	fx.t.Helper()
	waiting, err := v.AwaitingFor(context.Background(), room, session, 100)
	if err != nil {
		fx.t.Fatalf("AwaitingFor: %v", err)
	}
	var ids []string
	for _, w := range waiting {
		ids = append(ids, w.EventID)
	}
	return ids
}

// TestAwaitingKeys checks the journal's side of encrypted rooms: an event
// whose key has not come is journaled (and deduplicated) but is never work
// and never on screen until its cleartext is resolved through the rules of
// a clear event, and a fence, a redaction or a deadline decides it first.
func TestAwaitingKeys(t *testing.T, f Factory) {
	ctx := context.Background()

	t.Run("AnEventAwaitingItsKeyIsNeitherWorkNorShownUntilItsKeyComes", func(t *testing.T) {
		fx := newFixture(t, f)
		cipher := encrypted("$c1", alice, 1000)
		res := fx.admit(fx.v, []journal.Inbound{awaitingIn(cipher, journal.Live)}, "s1")
		if got, want := outcomes(res), "$c1:admitted/context_only"; got != want || !res[0].Awaiting {
			t.Fatalf("admission = %s (awaiting %t), want %s awaiting", got, res[0].Awaiting, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want nothing while the key is missing", got)
		}
		if got := fx.roomScreen(); len(got) != 0 {
			t.Fatalf("room = %v, want nothing while the key is missing", got)
		}
		if got, want := fx.awaitingIDs(fx.v), []string{"$c1"}; !slices.Equal(got, want) {
			t.Fatalf("awaiting = %v, want %v", got, want)
		}
		waits, err := fx.v.KeyWaits(ctx, 10)
		if err != nil {
			t.Fatalf("KeyWaits: %v", err)
		}
		if want := []journal.KeyWait{{RoomID: room, Session: session}}; !slices.Equal(waits, want) {
			t.Fatalf("key waits = %v, want %v", waits, want)
		}
		// A sync redelivered after a crash brings the ciphertext again.
		if got, want := outcomes(fx.admit(fx.v, []journal.Inbound{awaitingIn(cipher, journal.Live)}, "s1")), "$c1:duplicate"; got != want {
			t.Fatalf("redelivery = %s, want %s", got, want)
		}
		if got, want := fx.resolve(fx.v, "$c1", cleartext(msg("$c1", alice, 1000, "secret"), journal.Live)), journal.KeyResolved; got != want {
			t.Fatalf("resolve = %v, want %v", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$c1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
		p := fx.pending(fx.v)
		if got, want := string(p[0].Event), canonicalEvent(t, msg("$c1", alice, 1000, "secret"), room); got != want {
			t.Fatalf("replay payload = %s, want %s", got, want)
		}
		if got, want := fx.roomScreen(), []string{shown("$c1", "secret")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got := fx.awaitingIDs(fx.v); len(got) != 0 {
			t.Fatalf("awaiting = %v after the key came, want nothing", got)
		}
		// A second resolve (the key arrived twice) changes nothing.
		if got, want := fx.resolve(fx.v, "$c1", cleartext(msg("$c1", alice, 1000, "secret"), journal.Live)), journal.KeyNotAwaiting; got != want {
			t.Fatalf("second resolve = %v, want %v", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$c1"}; !slices.Equal(got, want) {
			t.Fatalf("pending after a second resolve = %v, want %v", got, want)
		}
	})

	t.Run("ResolvedWorkKeepsItsPlaceInReceiptOrder", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(msg("$m1", alice, 1000, "one").In(room, journal.Live))
		fx.mustAdmit(awaitingIn(encrypted("$c2", alice, 1001), journal.Live))
		fx.mustAdmit(msg("$m3", alice, 1002, "three").In(room, journal.Live))
		fx.resolve(fx.v, "$c2", cleartext(msg("$c2", alice, 1001, "two"), journal.Live))
		if got, want := fx.pendingIDs(fx.v), []string{"$m1", "$c2", "$m3"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("ResolvedHistoryIsShownButNeverWork", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(awaitingIn(encrypted("$old", alice, 1000), journal.History))
		if got, want := fx.resolve(fx.v, "$old", cleartext(msg("$old", alice, 1000, "long ago"), journal.Live)), journal.KeyResolved; got != want {
			t.Fatalf("resolve = %v, want %v", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want nothing: history is never work, whatever the cleartext says", got)
		}
		if got, want := fx.roomScreen(), []string{shown("$old", "long ago")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("ADepartureWhileTheKeyIsMissingVoidsTheEvent", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(awaitingIn(encrypted("$c1", alice, 1000), journal.Live))
		if _, err := fx.v.FenceDeparture(ctx, room, journal.DepartureRemoved, "kick-1"); err != nil {
			t.Fatalf("FenceDeparture: %v", err)
		}
		if err := fx.v.RecordJoin(ctx, room, "join-2"); err != nil {
			t.Fatalf("RecordJoin: %v", err)
		}
		if got := fx.awaitingIDs(fx.v); len(got) != 0 {
			t.Fatalf("awaiting = %v after the fence, want nothing", got)
		}
		if got, want := fx.resolve(fx.v, "$c1", cleartext(msg("$c1", alice, 1000, "secret"), journal.Live)), journal.KeyNotAwaiting; got != want {
			t.Fatalf("resolve after the fence = %v, want %v", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want nothing of the old membership", got)
		}
		if got := fx.roomScreen(); len(got) != 0 {
			t.Fatalf("room = %v, want nothing of the old membership", got)
		}
	})

	t.Run("ARedactionThatCameWhileTheKeyWasMissingWins", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(awaitingIn(encrypted("$c1", alice, 1000), journal.Live))
		fx.live(redaction("$r1", alice, 1001, "$c1"))
		fx.resolve(fx.v, "$c1", cleartext(msg("$c1", alice, 1000, "regretted"), journal.Live))
		if got, want := fx.pendingIDs(fx.v), []string{"$r1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want only the redaction", got)
		}
		if got := fx.roomScreen(); len(got) != 0 {
			t.Fatalf("room = %v, want the redacted message gone", got)
		}
	})

	t.Run("AnEditThatCameWhileTheKeyWasMissingIsApplied", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(awaitingIn(encrypted("$c1", alice, 1000), journal.Live))
		fx.live(edit("$e1", alice, 1001, "$c1", "fixed"))
		fx.resolve(fx.v, "$c1", cleartext(msg("$c1", alice, 1000, "tpyo"), journal.Live))
		if got, want := fx.roomScreen(), []string{shown("$c1", "fixed")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("AnEventPastItsDeadlineIsSettledAsUndecryptable", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(awaitingIn(encrypted("$c1", alice, 1000), journal.Live))
		n, err := fx.v.ExpireAwaiting(ctx, 0)
		if err != nil || n != 0 {
			t.Fatalf("ExpireAwaiting(before anything) = %d, %v; want 0", n, err)
		}
		n, err = fx.v.ExpireAwaiting(ctx, farFuture)
		if err != nil || n != 1 {
			t.Fatalf("ExpireAwaiting = %d, %v; want 1", n, err)
		}
		if got, want := fx.resolve(fx.v, "$c1", cleartext(msg("$c1", alice, 1000, "too late"), journal.Live)), journal.KeyNotAwaiting; got != want {
			t.Fatalf("resolve after the deadline = %v, want %v", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want nothing", got)
		}
		if got, want := outcomes(fx.admit(fx.v, []journal.Inbound{awaitingIn(encrypted("$c1", alice, 1000), journal.Live)}, "")), "$c1:duplicate"; got != want {
			t.Fatalf("redelivery after the deadline = %s, want %s", got, want)
		}
	})

	t.Run("AMalformedCleartextIsRecordedAndSettled", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(awaitingIn(encrypted("$c1", alice, 1000), journal.Live))
		bad := journal.Inbound{RoomID: room, Provenance: journal.Live,
			Event: json.RawMessage(`{"event_id":"$c1","type":"m.room.message","sender":"` + alice + `","origin_server_ts":1000,"content":"not an object"}`)}
		if got, want := fx.resolve(fx.v, "$c1", bad), journal.KeyMalformed; got != want {
			t.Fatalf("resolve = %v, want %v", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want nothing", got)
		}
		if got := fx.awaitingIDs(fx.v); len(got) != 0 {
			t.Fatalf("awaiting = %v, want nothing", got)
		}
		fx.live(msg("$m2", alice, 1001, "later"))
		if got, want := fx.pendingIDs(fx.v), []string{"$m2"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v: a bad cleartext blocks nothing", got, want)
		}
	})

	t.Run("AnotherPrincipalNeitherSeesNorResolvesTheEvent", func(t *testing.T) {
		fx := newFixture(t, f)
		other := fx.principal("other", "@other:example.org")
		fx.mustAdmit(awaitingIn(encrypted("$c1", alice, 1000), journal.Live))
		if got := fx.awaitingIDs(other); len(got) != 0 {
			t.Fatalf("another principal's awaiting = %v, want nothing", got)
		}
		waiting, err := fx.v.AwaitingFor(ctx, room, session, 10)
		if err != nil || len(waiting) != 1 {
			t.Fatalf("AwaitingFor = %v, %v", waiting, err)
		}
		out, err := other.ResolveAwaiting(ctx, waiting[0].Seq, cleartext(msg("$c1", alice, 1000, "secret"), journal.Live))
		if err != nil || out != journal.KeyNotAwaiting {
			t.Fatalf("another principal's resolve = %v, %v; want %v", out, err, journal.KeyNotAwaiting)
		}
		if got, want := fx.awaitingIDs(fx.v), []string{"$c1"}; !slices.Equal(got, want) {
			t.Fatalf("awaiting = %v, want %v", got, want)
		}
	})
}
