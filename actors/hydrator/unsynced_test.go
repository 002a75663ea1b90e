package hydrator_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors/hydrator"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// heldSync passes every call to the real homeserver, but a sync asked
// while it is held waits until it is let go, so the principal's sync
// stands still where it is.
type heldSync struct {
	principal.Transport
	mu      sync.Mutex
	gate    chan struct{} // nil while syncs go on
	waiting chan struct{} // signalled when a sync waits at the gate
}

func (h *heldSync) Sync(ctx context.Context, since string, timeout time.Duration) (*matrix.SyncBatch, error) {
	h.mu.Lock()
	gate := h.gate
	h.mu.Unlock()
	if gate != nil {
		select {
		case h.waiting <- struct{}{}:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return h.Transport.Sync(ctx, since, timeout)
}

// hold stops the syncs and returns once one waits at the gate: none is in
// flight, and the journal's token is where the sync stands.
func (h *heldSync) hold(t *testing.T) {
	h.mu.Lock()
	h.gate = make(chan struct{})
	h.mu.Unlock()
	select {
	case <-h.waiting:
	case <-time.After(testDeadline):
		t.Fatal("the sync never came back to wait")
	}
}

func (h *heldSync) release() {
	h.mu.Lock()
	close(h.gate)
	h.gate = nil
	h.mu.Unlock()
}

// threadRelated waits until the server lists reply among root's thread
// relations, asking through the client directly.
func (f *fixture) threadRelated(root, reply string) {
	f.t.Helper()
	f.settled(reply)
	for deadline := time.Now().Add(testDeadline); ; {
		page, err := f.client.Relations(f.ctx, f.room, root, "m.thread", "", hydrator.DefaultRelationsPageSize)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, raw := range page.Chunk {
			var ev struct {
				EventID string `json:"event_id"`
			}
			if json.Unmarshal(raw, &ev) == nil && ev.EventID == reply {
				return
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the server never listed %s in the thread of %s", reply, root)
		}
		time.Sleep(20 * time.Millisecond) // Dendrite offers no signal for its relations index
	}
}

func TestAReplyTheSyncHasNotBroughtYetIsNotInstalledByAThreadWalkAndIsAnswered(t *testing.T) {
	f := newFixture(t, hydrator.Deps{})
	tr := &heldSync{Transport: f.client, waiting: make(chan struct{}, 1)}
	pid := f.system.Root.Spawn(principal.Props(principal.Deps{
		Store: f.view, Transport: tr, Agent: agent.Echo{}, Conversation: f.reader,
		Sender: matrix.NewSender(f.client), Reconciler: matrix.NewReconciler(f.client), DeviceID: f.client.DeviceID(),
		AutoJoin: true, Log: zerolog.Nop(), SyncTimeout: time.Second,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		OnFault: func(err error) { t.Errorf("principal stopped: %v", err) },
	}))
	t.Cleanup(func() { _ = f.system.Root.StopFuture(pid).Wait() })
	root := f.alice.SendText(f.room, "root")
	f.awaitBody(f.bot.UserID, "echo: root")

	tr.hold(t)
	reply := f.alice.ThreadReply(f.room, root, "a reply the sync has not brought")
	f.threadRelated(root, reply)

	page, err := f.reader.Read(f.ctx, journal.ReadRequest{RoomID: f.room, Thread: &root, Limit: 50, Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bodies(page) {
		if b == "a reply the sync has not brought" {
			t.Fatalf("the thread walk installed a reply the sync has not brought: %q", bodies(page))
		}
	}
	tr.release()
	f.awaitBody(f.bot.UserID, "echo: a reply the sync has not brought")
	if got := f.agentMessages(); got["echo: a reply the sync has not brought"] != 1 || got["echo: root"] != 1 {
		t.Fatalf("the agent said %v; want each answer once", got)
	}
}
