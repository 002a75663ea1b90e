package e2ee

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/pgfs"
	"github.com/mindroomd/mindroomd/testsupport/pg"
)

// fencePrincipal is the agent whose account the fence tests write.
var fencePrincipal = journal.Principal{Agent: "sealer", UserID: "@sealer:example.org"}

// replicaJournal opens the journal on url as the replica named replica.
func replicaJournal(t *testing.T, url, replica string) *pgfs.Store {
	t.Helper()
	s, err := pgfs.Open(context.Background(), pgfs.Options{URL: url, Leases: true, Replica: replica})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// accountStore opens the crypto store on url as the replica named replica
// ("" for a daemon alone), for fencePrincipal's account.
func accountStore(t *testing.T, url, replica string) *crypto.SQLCryptoStore {
	t.Helper()
	s, err := OpenPostgres(context.Background(), url, replica)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return crypto.NewSQLCryptoStore(s.db, nil, fencePrincipal.String(), "FENCEDEVICE", []byte("the fence test's pickle key"))
}

// fenced reports whether err is the fence's refusal.
func fenced(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == fenceCode
}

func TestOnlyTheReplicaHoldingAnAgentsLeaseWritesItsCryptoAccount(t *testing.T) {
	ctx := context.Background()
	url := pg.Start(t).Schema(t)
	ja, jb := replicaJournal(t, url, "a"), replicaJournal(t, url, "b")
	p, err := ja.Register(ctx, fencePrincipal)
	if err != nil {
		t.Fatal(err)
	}
	lease, held, err := ja.TryLease(ctx, p.ID)
	if err != nil || !held {
		t.Fatalf("a takes the lease: held %v, %v", held, err)
	}
	a, b, alone := accountStore(t, url, "a"), accountStore(t, url, "b"), accountStore(t, url, "")
	const name = id.Secret("m.cross_signing.self_signing")
	secret := func(want string) {
		t.Helper()
		if got, err := alone.GetSecret(ctx, name); err != nil || got != want {
			t.Fatalf("the stored secret = %q, %v; want %q", got, err, want)
		}
	}

	// a holds the lease: its writes go through, b's are refused.
	if err := a.PutAccount(ctx, crypto.NewOlmAccount()); err != nil {
		t.Fatalf("the holder stores the account: %v", err)
	}
	if err := a.PutSecret(ctx, name, "a's"); err != nil {
		t.Fatalf("the holder stores a secret: %v", err)
	}
	if err := b.PutSecret(ctx, name, "b's"); !fenced(err) {
		t.Fatalf("a replica without the lease stored a secret: %v, want the fence's refusal", err)
	}
	if err := b.PutAccount(ctx, crypto.NewOlmAccount()); !fenced(err) {
		t.Fatalf("a replica without the lease stored the account: %v, want the fence's refusal", err)
	}
	secret("a's")

	// The lease moves to b: now a, the stale holder, writes nothing, not
	// even a deletion.
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, held, err := jb.TryLease(ctx, p.ID); err != nil || !held {
		t.Fatalf("b takes the lease: held %v, %v", held, err)
	}
	if err := a.PutSecret(ctx, name, "stale a's"); !fenced(err) {
		t.Fatalf("the stale holder stored a secret: %v, want the fence's refusal", err)
	}
	if err := a.DeleteSecret(ctx, name); !fenced(err) {
		t.Fatalf("the stale holder deleted a secret: %v, want the fence's refusal", err)
	}
	secret("a's")
	if err := b.PutSecret(ctx, name, "b's"); err != nil {
		t.Fatalf("the new holder stores a secret: %v", err)
	}
	secret("b's")

	// A daemon alone on the database names no replica and is not fenced.
	if err := alone.PutSecret(ctx, name, "alone's"); err != nil {
		t.Fatalf("a daemon without replicas stores a secret: %v", err)
	}
	secret("alone's")
}
