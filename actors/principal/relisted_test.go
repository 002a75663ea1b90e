package principal_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// relistingHomeserver is a Transport that plays one script: an invite,
// then, once this run has accepted it, the batch whose timeline first
// shows the join, which lists the invite again. A homeserver may do that
// until its sync stream has the join, but no real one does it on demand,
// so the listing is injected here. Each sync waits for what the script
// needs to have happened, never for time.
type relistingHomeserver struct {
	user, room string
	// accepted is closed once the journal has recorded the join that
	// accepting the invite made.
	accepted <-chan struct{}
	// applied is closed when the sync after the relisting is asked for:
	// the sync loop asks for the next batch only once it has applied one.
	applied   chan struct{}
	applyOnce sync.Once

	mu    sync.Mutex
	joins int
}

// Script tokens: what each sync is asked from.
const (
	tokenInvited  = "s1"
	tokenRelisted = "s2"
	tokenAfter    = "s3"
)

// Relisting events.
const (
	relistedJoin    = "$bot-join"
	relistedMessage = "$after-the-join"
)

func (h *relistingHomeserver) UserID() string { return h.user }

func (h *relistingHomeserver) Sync(ctx context.Context, since string, _ time.Duration) (*matrix.SyncBatch, error) {
	switch since {
	case "":
		return &matrix.SyncBatch{NextBatch: tokenInvited}, nil
	case tokenInvited:
		return &matrix.SyncBatch{NextBatch: tokenRelisted, Invited: []string{h.room}}, nil
	case tokenRelisted:
		// The relisting comes after the acceptance, as a homeserver's
		// would: never before the journal has the join.
		select {
		case <-h.accepted:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		ts := testsupport.DefaultNow.UnixMilli()
		join := mx.Member(relistedJoin, h.user, ts, "join").With("unsigned", map[string]any{
			"prev_content": map[string]any{"membership": "invite"},
		})
		said := mx.Message(relistedMessage, "@alice:example.org", ts+1, "said to the live membership")
		return &matrix.SyncBatch{
			NextBatch: tokenAfter,
			Joined:    []matrix.RoomTimeline{{RoomID: h.room, Events: []json.RawMessage{join.JSON(), said.JSON()}}},
			Invited:   []string{h.room},
		}, nil
	}
	h.applyOnce.Do(func() { close(h.applied) })
	<-ctx.Done()
	return nil, ctx.Err()
}

// Join accepts the invite once. The script has no second invite to
// accept: a second join waits for the end of the test, so nothing it
// would write lands between the relisting and the test's checks.
func (h *relistingHomeserver) Join(ctx context.Context, _ string) (string, error) {
	h.mu.Lock()
	h.joins++
	again := h.joins > 1
	h.mu.Unlock()
	if again {
		<-ctx.Done()
		return "", ctx.Err()
	}
	return relistedJoin, nil
}

func (h *relistingHomeserver) joined() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.joins
}

// errOffScript answers what the script never asks for.
var errOffScript = errors.New("not in the relisting script")

func (h *relistingHomeserver) Messages(context.Context, string, string, matrix.Direction, int) (matrix.MessagesPage, error) {
	return matrix.MessagesPage{}, errOffScript
}

func (h *relistingHomeserver) Leave(context.Context, string) error { return errOffScript }

func (h *relistingHomeserver) Send(context.Context, string, string, string, json.RawMessage) (string, error) {
	return "", errOffScript
}

// acceptedJoin is the principal's journal view; once the join that
// accepting an invite records (one without an observation) has committed,
// it notes the epoch that join began and closes accepted.
type acceptedJoin struct {
	journal.PrincipalStore
	once     sync.Once
	accepted chan struct{}
	epoch    int64
}

func (j *acceptedJoin) RecordJoin(ctx context.Context, room, observation string) error {
	err := j.PrincipalStore.RecordJoin(ctx, room, observation)
	if err != nil || observation != "" {
		return err
	}
	j.once.Do(func() {
		j.epoch, _, err = j.PrincipalStore.RoomEpoch(ctx, room)
		close(j.accepted)
	})
	return err
}

// An invite this run accepted, listed again in the batch that first shows
// the room joined, is no removal: the membership the acceptance began is
// the live one, so nothing is fenced and what the room says in that batch
// is owed an answer.
func TestAnInviteThisRunAcceptedListedAgainBeforeTheSyncShowsTheJoinFencesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	s, _ := testsupport.MustOpen(t)
	v, err := s.Principal(ctx, "echo", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	view := &acceptedJoin{PrincipalStore: v, accepted: make(chan struct{})}
	server := &relistingHomeserver{user: "@bot:example.org", room: "!relisted:example.org",
		accepted: view.accepted, applied: make(chan struct{})}
	system := actors.NewSystem(zerolog.Nop())
	pid := system.Root.Spawn(principal.Props(principal.Deps{
		Store: view, Transport: server, Hints: s.Hints(), AutoJoin: true, Log: testLog(t),
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		OnFault: func(err error) { t.Errorf("principal stopped: %v", err) },
	}))
	t.Cleanup(func() {
		if err := system.Root.StopFuture(pid).Wait(); err != nil {
			t.Errorf("stop principal: %v", err)
		}
	})

	select {
	case <-server.applied:
	case <-ctx.Done():
		t.Fatal("the batch that listed the invite again was never applied")
	}
	acceptedEpoch := view.epoch // written before accepted closed, and so before the relisting

	epoch, departed, err := v.RoomEpoch(ctx, server.room)
	if err != nil {
		t.Fatal(err)
	}
	if departed || epoch != acceptedEpoch {
		t.Errorf("after the accepted invite was listed again the room is at epoch %d (departed %v), want the accepted membership's %d, in",
			epoch, departed, acceptedEpoch)
	}
	page, err := v.Pending(ctx, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 1 || page.Events[0].EventID != relistedMessage || page.Events[0].Epoch != acceptedEpoch {
		t.Errorf("pending work = %+v, want %s, owed an answer under epoch %d", page.Events, relistedMessage, acceptedEpoch)
	}
	// Nothing holds the sync token for an invite accepted already.
	if tok, err := v.SyncToken(ctx); err != nil || tok != tokenAfter {
		t.Errorf("the sync token is %q (%v), want %q: the next_batch of the batch that listed the invite again", tok, err, tokenAfter)
	}
	if n := server.joined(); n != 1 {
		t.Errorf("the invite was accepted %d times, want once", n)
	}
}
