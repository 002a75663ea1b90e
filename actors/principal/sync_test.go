package principal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// failingJoins passes every call to the real homeserver except joins:
// while refuse is above zero, a join is refused with a rate limit instead
// (Dendrite's limits are off in tests) and refuse counts down. A refuse
// below zero refuses every join.
type failingJoins struct {
	principal.Transport
	mu       sync.Mutex
	refuse   int
	attempts map[string]int
	tried    chan string
}

func newFailingJoins() *failingJoins {
	return &failingJoins{attempts: map[string]int{}, tried: make(chan string, 100)}
}

func (f *failingJoins) Join(ctx context.Context, room string) (string, error) {
	f.mu.Lock()
	f.attempts[room]++
	refuse := f.refuse != 0
	if f.refuse > 0 {
		f.refuse--
	}
	f.mu.Unlock()
	select {
	case f.tried <- room:
	default:
	}
	if refuse {
		return "", &matrix.HTTPError{Status: 429, ErrCode: "M_LIMIT_EXCEEDED", RetryAfter: 10 * time.Millisecond}
	}
	return f.Transport.Join(ctx, room)
}

func (f *failingJoins) set(refuse int) {
	f.mu.Lock()
	f.refuse = refuse
	f.mu.Unlock()
}

func (f *failingJoins) attemptsAt(room string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts[room]
}

// use makes joins the fixture's transport, around the real client.
func (f *fixture) use(joins *failingJoins) {
	f.transport = func(t principal.Transport) principal.Transport {
		joins.Transport = t
		return joins
	}
}

// awaitJoinedIn waits until the agent has joined room for the nth time.
func (f *fixture) awaitJoinedIn(room string, n int) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	f.alice.AwaitEvent(ctx, room, dendrite.Joined(f.bot.UserID, n))
}

// awaitReplyIn waits until alice's sync shows the agent's answer to text
// in room.
func (f *fixture) awaitReplyIn(room, text string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	f.alice.AwaitEvent(ctx, room, func(raw json.RawMessage) bool {
		sender, b := body(raw)
		return sender == f.bot.UserID && b == "echo: "+text
	})
}

func TestAFailedAutoJoinIsRetriedUntilItSucceeds(t *testing.T) {
	f := newFixture(t)
	joins := newFailingJoins()
	f.use(joins)
	f.start()
	f.awaitJoined()

	joins.set(3)
	room := f.alice.CreateRoom(f.bot.UserID)
	f.awaitJoinedIn(room, 1)
	f.alice.SendText(room, "after the join")
	f.awaitReplyIn(room, "after the join")
	if n := joins.attemptsAt(room); n != 4 {
		t.Fatalf("the join was attempted %d times, want 4: three refused, then accepted", n)
	}
}

func TestAnInviteOfTheFirstSyncWhoseJoinFailsIsAcceptedLater(t *testing.T) {
	f := newFixture(t) // the agent is invited before its first sync
	joins := newFailingJoins()
	joins.set(2)
	f.use(joins)
	f.start()
	f.awaitJoined()
	f.alice.SendText(f.room, "hello")
	f.awaitReply("hello")
	if n := joins.attemptsAt(f.room); n != 3 {
		t.Fatalf("the join was attempted %d times, want 3", n)
	}
}

func TestAnInviteWhoseJoinKeptFailingIsAcceptedAfterARestart(t *testing.T) {
	f := newFixture(t)
	joins := newFailingJoins()
	f.use(joins)
	f.start()
	f.awaitJoined()

	joins.set(-1)
	room := f.alice.CreateRoom(f.bot.UserID)
	for deadline := time.After(testDeadline); joins.attemptsAt(room) < 2; {
		select {
		case <-joins.tried:
		case <-deadline:
			t.Fatalf("the join was attempted %d times, want a retry", joins.attemptsAt(room))
		}
	}
	f.stop()

	joins.set(0)
	f.start()
	f.awaitJoinedIn(room, 1)
	f.alice.SendText(room, "after the restart")
	f.awaitReplyIn(room, "after the restart")
}

// awaitSettledUnanswered waits until the journal holds no pending work and no reply
// to eventID: the event was settled without an answer.
func (f *fixture) awaitSettledUnanswered(eventID string) {
	f.t.Helper()
	sub := f.store.Hints().Subscribe(f.view.Principal().String())
	defer sub.Close()
	deadline := time.After(testDeadline)
	for {
		page, err := f.view.Pending(f.ctx, 100, 0)
		if err != nil {
			f.t.Fatal(err)
		}
		if len(page.Events) == 0 {
			break
		}
		select {
		case <-sub.C():
		case <-deadline:
			f.t.Fatalf("%d events still pending, the first %s", len(page.Events), page.Events[0].EventID)
		}
	}
	f.noReply(eventID)
}

// noReply fails the test when the journal holds a reply to eventID.
func (f *fixture) noReply(eventID string) {
	f.t.Helper()
	d, err := f.view.Delivery(f.ctx, journal.ReplyDeliveryID(eventID), journal.StageFinal)
	if err == nil {
		f.t.Fatalf("the journal holds a reply to %s: %+v", eventID, d)
	}
	if !errors.Is(err, journal.ErrNoDelivery) {
		f.t.Fatal(err)
	}
}

// setFail tells the echo agent to fail on body, or to answer it again.
func (f *fixture) setFail(body string, fail bool) {
	f.agent.mu.Lock()
	f.agent.fail[body] = fail
	f.agent.mu.Unlock()
}

func TestAKickWhileTheDaemonWasDownFencesTheOldMembershipBeforeTheRejoin(t *testing.T) {
	f := newFixture(t)
	f.setFail("before the kick", true) // it stays pending through the kick
	f.start()
	f.awaitJoined()
	old := f.alice.SendText(f.room, "before the kick")
	f.alice.SendText(f.room, "answered")
	f.awaitReply("answered")
	f.stop()

	f.alice.Kick(f.room, f.bot.UserID)
	// More than one sync timeline holds, so the sync after the rejoin
	// cannot show the kick either.
	for i := range matrix.TimelineLimit + 5 {
		f.alice.SendText(f.room, fmt.Sprintf("while away %d", i))
	}
	f.alice.Invite(f.room, f.bot.UserID)
	f.start()
	f.awaitJoinedAgain()
	f.setFail("before the kick", false)
	f.alice.SendText(f.room, "after the rejoin")
	f.awaitReply("after the rejoin")
	f.awaitSettledUnanswered(old)
	got := f.replies()
	if got["echo: before the kick"] != 0 || got["echo: after the rejoin"] != 1 || got["echo: answered"] != 1 || len(got) != 2 {
		t.Fatalf("answers = %v, want only the rejoined membership's message and the one answered before", got)
	}
}

func TestTheFirstSyncOfAFreshJournalIsHistoryNeverWork(t *testing.T) {
	f := newFixture(t)
	hs.User(t, f.bot).Join(f.room) // joined before the daemon ever ran
	for i := range 3 {
		f.alice.SendText(f.room, fmt.Sprintf("before the first start %d", i))
	}
	f.start()
	f.alice.SendText(f.room, "after the start")
	f.awaitReply("after the start")
	if got := f.replies(); got["echo: after the start"] != 1 || len(got) != 1 {
		t.Fatalf("answers = %v, want only the message after the start", got)
	}
	page, err := f.view.Pending(f.ctx, 100, 0)
	if err != nil || len(page.Events) != 0 {
		t.Fatalf("pending = %d events (%v), want none", len(page.Events), err)
	}
	f.screen(func(s []string) bool { return contains(s, "before the first start 0", "after the start") })
}

func TestAKickOrABanFencesTheMembershipAsTheAgentsOwnLeaveDoes(t *testing.T) {
	for _, c := range []struct {
		name        string
		remove, let func(cli *mautrix.Client, room, user string) error
	}{
		{"Kick", func(cli *mautrix.Client, room, user string) error {
			_, err := cli.KickUser(context.Background(), id.RoomID(room), &mautrix.ReqKickUser{UserID: id.UserID(user)})
			return err
		}, nil},
		{"Ban", func(cli *mautrix.Client, room, user string) error {
			_, err := cli.BanUser(context.Background(), id.RoomID(room), &mautrix.ReqBanUser{UserID: id.UserID(user)})
			return err
		}, func(cli *mautrix.Client, room, user string) error {
			_, err := cli.UnbanUser(context.Background(), id.RoomID(room), &mautrix.ReqUnbanUser{UserID: id.UserID(user)})
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			f.setFail("pending", true) // it stays pending until the removal
			f.start()
			f.awaitJoined()
			pending := f.alice.SendText(f.room, "pending")
			f.alice.SendText(f.room, "answered")
			f.awaitReply("answered")

			if err := c.remove(f.alice.Client, f.room, f.bot.UserID); err != nil {
				t.Fatal(err)
			}
			f.awaitSettledUnanswered(pending) // the sync showed the removal: nothing of the membership is owed
			f.setFail("pending", false)
			away := f.alice.SendText(f.room, "while out")
			if c.let != nil {
				if err := c.let(f.alice.Client, f.room, f.bot.UserID); err != nil {
					t.Fatal(err)
				}
			}
			f.alice.Invite(f.room, f.bot.UserID)
			f.awaitJoinedAgain()
			f.alice.SendText(f.room, "after the rejoin")
			f.awaitReply("after the rejoin")
			f.awaitSettledUnanswered(pending)
			f.noReply(away)
			if got := f.replies(); got["echo: after the rejoin"] != 1 || got["echo: answered"] != 1 || len(got) != 2 {
				t.Fatalf("answers = %v, want only what came before the removal and after the rejoin", got)
			}
		})
	}
}

// failingLeave passes every call to the real homeserver except the first
// leave, which fails as a dropped connection would, before the server
// sees it.
type failingLeave struct {
	principal.Transport
	mu     sync.Mutex
	failed bool
}

func (f *failingLeave) Leave(ctx context.Context, room string) error {
	f.mu.Lock()
	first := !f.failed
	f.failed = true
	f.mu.Unlock()
	if first {
		return errors.New("connection reset by peer")
	}
	return f.Transport.Leave(ctx, room)
}

func TestAFailedHomeserverLeaveDoesNotLeaveTheAgentSilentInTheRoom(t *testing.T) {
	f := newFixture(t)
	f.transport = func(t principal.Transport) principal.Transport { return &failingLeave{Transport: t} }
	f.start()
	f.awaitJoined()
	f.alice.SendText(f.room, "before the leave")
	f.awaitReply("before the leave")

	leave := func() error {
		res, err := f.system.Root.RequestFuture(f.pid, &principal.Leave{RoomID: f.room}, testDeadline).Result()
		if err != nil {
			t.Fatal(err)
		}
		return res.(*principal.Left).Err
	}
	if err := leave(); err == nil {
		t.Fatal("the leave succeeded; the test needs it to fail")
	}
	f.alice.SendText(f.room, "after the failed leave")
	f.awaitReply("after the failed leave")

	if err := leave(); err != nil {
		t.Fatalf("leave again: %v", err)
	}
	f.awaitNoOwedReports() // the echo of the leave that took consumed the one report owed
	if _, departed, err := f.view.RoomEpoch(f.ctx, f.room); err != nil || !departed {
		t.Fatalf("after the leave departed=%v (err %v), want out of the room", departed, err)
	}
	if got := f.replies(); got["echo: before the leave"] != 1 || got["echo: after the failed leave"] != 1 || len(got) != 2 {
		t.Fatalf("answers = %v, want one each", got)
	}
}

// heldSyncs passes every call to the real homeserver until, once armed,
// a sync lists an invite to room; every sync after that one waits for the
// test's end, so the journal stays as that batch and the join leave it.
type heldSyncs struct {
	principal.Transport
	room   string
	mu     sync.Mutex
	armed  bool
	listed string // the next_batch of the batch that listed the invite
}

func (h *heldSyncs) arm() {
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
}

func (h *heldSyncs) Sync(ctx context.Context, since string, timeout time.Duration) (*matrix.SyncBatch, error) {
	if h.listedAt() != "" {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	batch, err := h.Transport.Sync(ctx, since, timeout)
	h.mu.Lock()
	if err == nil && h.armed && slices.Contains(batch.Invited, h.room) {
		h.listed = batch.NextBatch
	}
	h.mu.Unlock()
	return batch, err
}

func (h *heldSyncs) listedAt() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.listed
}

func TestAnAcceptedInviteLetsGoOfTheSyncTokenBeforeTheJoinIsRecorded(t *testing.T) {
	f := newFixture(t)
	held := &heldSyncs{room: f.room}
	f.transport = func(t principal.Transport) principal.Transport {
		held.Transport = t
		return held
	}
	f.start()
	f.awaitJoined()
	res, err := f.system.Root.RequestFuture(f.pid, &principal.Leave{RoomID: f.room}, testDeadline).Result()
	if err != nil || res.(*principal.Left).Err != nil {
		t.Fatalf("leave: %v %v", err, res)
	}
	f.awaitNoOwedReports()
	held.arm()
	f.alice.SendText(f.room, "while the agent was away")
	f.alice.Invite(f.room, f.bot.UserID)
	f.awaitJoinedAgain()
	for deadline := time.Now().Add(testDeadline); ; {
		_, departed, err := f.view.RoomEpoch(f.ctx, f.room)
		if err != nil {
			t.Fatal(err)
		}
		if !departed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the journal never recorded the rejoin")
		}
		time.Sleep(10 * time.Millisecond) // a join commits no hint to wait on
	}
	// No sync has brought the join: a room walk now starts at the stored
	// token, and what the room said while the agent was away lies after
	// the since of the batch that listed the invite.
	tok, err := f.view.SyncToken(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := held.listedAt(); tok != want {
		t.Fatalf("with the join recorded the sync token is %q, want %q: the next_batch of the batch that listed the invite", tok, want)
	}
}
