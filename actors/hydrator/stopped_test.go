package hydrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/actors/hydrator"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// stalled is a homeserver that never answers a walk: each request reports
// itself on entered and waits until its walk ends.
type stalled struct{ entered chan struct{} }

func (s stalled) wait(ctx context.Context) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s stalled) Messages(ctx context.Context, _, _ string, _ matrix.Direction, _ int) (matrix.MessagesPage, error) {
	return matrix.MessagesPage{}, s.wait(ctx)
}

func (s stalled) Relations(ctx context.Context, _, _, _, _ string, _ int) (matrix.RelationsPage, error) {
	return matrix.RelationsPage{}, s.wait(ctx)
}

func (s stalled) Event(ctx context.Context, _, _ string) (json.RawMessage, error) {
	return nil, s.wait(ctx)
}

// readAsync reads through reader with no deadline of its own, as a turn
// does, and hands back the error.
func readAsync(reader *hydrator.Reader, req journal.ReadRequest) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := reader.Read(context.Background(), req)
		done <- err
	}()
	return done
}

// promptly waits for a read's error, failing the test if the read still
// waits after a few seconds: nothing is left that could answer it.
func promptly(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the read still waits for the stopped hydrator")
		return nil
	}
}

func TestAReadThroughAStoppedHydratorFailsInsteadOfWaitingForever(t *testing.T) {
	f := newFixture(t, hydrator.Deps{})
	f.alice.SendText(f.room, "said while the agent was away")
	if err := f.system.Root.StopFuture(f.pid).Wait(); err != nil {
		t.Fatal(err)
	}
	strict := journal.ReadRequest{RoomID: f.room, Limit: 10, Strict: true}
	if err := promptly(t, readAsync(f.reader, strict)); !errors.Is(err, hydrator.ErrStopped) || !errors.Is(err, journal.ErrStrictRead) {
		t.Fatalf("strict read after the stop: %v, want %v and %v", err, journal.ErrStrictRead, hydrator.ErrStopped)
	}
	// A read that is not strict serves what the journal holds.
	if err := promptly(t, readAsync(f.reader, journal.ReadRequest{RoomID: f.room, Limit: 10})); err != nil {
		t.Fatalf("read after the stop: %v, want the journal's page", err)
	}
}

func TestAReadWaitingForAWalkFailsWhenTheHydratorStopsMidWalk(t *testing.T) {
	f := newFixture(t, hydrator.Deps{})
	server := stalled{entered: make(chan struct{}, 1)}
	pid := f.system.Root.Spawn(hydrator.Props(hydrator.Deps{Store: f.view, Transport: server}))
	reader := &hydrator.Reader{Store: f.view, Root: f.system.Root, Hydrator: pid}
	done := readAsync(reader, journal.ReadRequest{RoomID: f.room, Limit: 10, Strict: true})
	select {
	case <-server.entered:
	case <-time.After(testDeadline):
		t.Fatal("the walk never reached the homeserver")
	}
	if err := f.system.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := promptly(t, done); !errors.Is(err, hydrator.ErrStopped) {
		t.Fatalf("read when the hydrator stopped mid-walk: %v, want %v", err, hydrator.ErrStopped)
	}
}
