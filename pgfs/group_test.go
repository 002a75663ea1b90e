package pgfs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/pgfs"
)

const insertMeta = `INSERT INTO store_meta (key, value) VALUES ($1, 'x')`

func TestCommandsThatWaitedCommitInOneTransactionAndAFailingOneAlone(t *testing.T) {
	ctx := context.Background()
	s, err := pgfs.Open(ctx, pgfs.Options{URL: cluster.Schema(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := s.Register(ctx, journal.Principal{Agent: "grouped", UserID: "@grouped:example.org"})
	if err != nil {
		t.Fatal(err)
	}
	// The first command holds its transaction open until three more are
	// waiting behind it.
	hold, holding := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- s.Group(ctx, p.ID, func(tx *pgfs.Tx) error {
			close(holding)
			<-hold
			return tx.Raw(insertMeta, "first")
		})
	}()
	<-holding
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids = map[string]int64{}
		out = map[string]error{}
	)
	for i, key := range []string{"b", "first", "d"} { // "first" again: a unique violation
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Group(ctx, p.ID, func(tx *pgfs.Tx) error {
				id, err := tx.ID()
				if err != nil {
					return err
				}
				mu.Lock()
				ids[key] = id
				mu.Unlock()
				return tx.Raw(insertMeta, key)
			})
			mu.Lock()
			out[key] = err
			mu.Unlock()
		}()
		// One at a time, so they queue in this order.
		for deadline := time.Now().Add(10 * time.Second); s.Waiting(p.ID) < i+1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d commands wait, want %d", s.Waiting(p.ID), i+1)
			}
		}
	}
	close(hold)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("the first command: %v", err)
	}
	if out["b"] != nil || out["d"] != nil {
		t.Fatalf("the commands beside the failing one = %v, %v; want both committed", out["b"], out["d"])
	}
	if !errors.Is(out["first"], journal.ErrConflict) {
		t.Fatalf("the failing command = %v, want its own ErrConflict", out["first"])
	}
	if ids["b"] != ids["d"] || ids["b"] != ids["first"] {
		t.Fatalf("transactions %v: the three that waited ran in one", ids)
	}
	for key, want := range map[string]int{"first": 1, "b": 1, "d": 1} {
		var n int
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM store_meta WHERE key = $1`, key).Scan(&n); err != nil || n != want {
			t.Fatalf("%s is stored %d times (%v), want %d", key, n, err, want)
		}
	}
}
