package bench

import (
	"context"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// storageBatch is the events per AdmitBatch (and IDs per Settle) when
// filling the storage benchmark's journal: big batches keep the fill fast;
// the layout on disk does not depend on them.
const storageBatch = 500

// BenchmarkStorage measures bytes on disk per admitted, settled message
// at 10^5 messages (16 principals × 32 rooms, ~300-byte text messages):
// admit through the store in batches, settle each batch after it is
// admitted (as an agent answering its backlog does), close the store
// (which checkpoints the WAL into the file and truncates it), then divide
// the database plus WAL size by the messages. Metric: disk-B/msg.
//
// A payload lives only while its event is pending; settling frees its page
// for the next payloads. A backlog left pending keeps its payload pages
// (~500 B per message) as free pages the file does not give back.
func BenchmarkStorage(b *testing.B) {
	ctx := context.Background()
	msgs := benchSizes().storageMsgs
	spec := fixtureSpec{Layout: "storage-16x32", N: msgs, Principals: admitPrincipals, Rooms: admitRooms}
	var perMsg float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dir := b.TempDir()
		s, err := store.Open(ctx, store.Options{StorageDir: dir})
		if err != nil {
			b.Fatal(err)
		}
		views := make([]journal.PrincipalStore, admitPrincipals)
		for p := range views {
			if views[p], err = s.Principal(ctx, agentName(p), agentUser(p)); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		if err := fillAndSettle(ctx, views, spec); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		// Close checkpoints the whole WAL into the file and truncates it.
		path := s.DB().Path
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		perMsg = float64(fileSize(path)+fileSize(path+"-wal")) / float64(msgs)
	}
	b.ReportMetric(perMsg, "disk-B/msg")
}

// fillAndSettle admits spec's messages live, one principal's batch of
// storageBatch at a time, then settles them all.
func fillAndSettle(ctx context.Context, views []journal.PrincipalStore, spec fixtureSpec) error {
	pending := make([][]journal.Inbound, len(views))
	admitted := make([][]string, len(views))
	flush := func(p int) error {
		if len(pending[p]) == 0 {
			return nil
		}
		if _, err := views[p].AdmitBatch(ctx, pending[p], ""); err != nil {
			return err
		}
		if _, err := views[p].Settle(ctx, admitted[p]...); err != nil {
			return err
		}
		pending[p], admitted[p] = pending[p][:0], admitted[p][:0]
		return nil
	}
	err := spec.each(func(_ int, m fixtureMessage) error {
		pending[m.Principal] = append(pending[m.Principal],
			mx.Live(roomID(m.Room), mx.Message(m.EventID, m.Sender, m.TS, m.Body))...)
		admitted[m.Principal] = append(admitted[m.Principal], m.EventID)
		if len(pending[m.Principal]) == storageBatch {
			return flush(m.Principal)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for p := range views {
		if err := flush(p); err != nil {
			return err
		}
	}
	return nil
}
