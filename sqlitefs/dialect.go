package sqlitefs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
)

// statements holds SQLite's text of the shared work's statements.
var statements = [journalsql.NumStmts]string{
	journalsql.SelectThreadOf:      selectThreadOf,
	journalsql.SelectJournaledSeq:  selectJournaledSeq,
	journalsql.SettleEvent:         settleEvent,
	journalsql.SettleEventInRoom:   settleEventInRoom,
	journalsql.InsertRejected:      insertRejected,
	journalsql.UpdateSyncToken:     updateSyncToken,
	journalsql.SelectPending:       selectPending,
	journalsql.SelectAdmittedEvent: selectAdmittedEvent,
	journalsql.SelectSyncTokenMS:   selectSyncTokenMS,
	journalsql.SelectSyncToken:     selectSyncToken,
	journalsql.SelectPrincipalID:   selectPrincipalID,
	journalsql.InsertPrincipal:     insertPrincipal,

	journalsql.SelectTombstone:       selectTombstone,
	journalsql.ProbeOriginal:         probeOriginal,
	journalsql.InsertTombstone:       insertTombstone,
	journalsql.SelectVisibleByEvent:  selectVisibleByEvent,
	journalsql.InsertVisible:         insertVisible,
	journalsql.UpdateVisibleRevision: updateVisibleRevision,
	journalsql.DeleteVisible:         deleteVisible,
	journalsql.ClearVisibleOnEdit:    clearVisibleOnEdit,
	journalsql.SelectHeldEdit:        selectHeldEdit,
	journalsql.UpsertHeldEdit:        upsertHeldEdit,
	journalsql.DeleteHeldEdits:       deleteHeldEdits,
	journalsql.TakeHeldEdits:         takeHeldEditsFor,
	journalsql.ClearHeldEdit:         clearHeldEdit,
	journalsql.SelectJournalEdit:     selectJournalEdit,
	journalsql.ProbeJournaled:        probeJournaled,

	journalsql.SelectDelivery:       selectDelivery,
	journalsql.SelectRetiredStage:   selectRetiredStage,
	journalsql.SelectSource:         selectSource,
	journalsql.InsertDelivery:       insertDelivery,
	journalsql.UpdateQueuedDelivery: updateQueuedDelivery,
	journalsql.ClaimDelivery:        claimDelivery,
	journalsql.RetireDelivery:       retireDelivery,
	journalsql.MoveDevice:           adoptDevice,
	journalsql.AckDelivery:          ackDelivery,
	journalsql.FailDelivery:         failDelivery,
	journalsql.SelectUnackedHead:    selectUnackedHead,
	journalsql.SelectUnackedAfter:   selectUnackedAfter,
	journalsql.SelectDeliveredEvent: selectDeliveredEvent,

	journalsql.SelectMembership:   selectMembership,
	journalsql.UpsertDeparture:    upsertDeparture,
	journalsql.UpsertJoin:         upsertJoin,
	journalsql.InsertObservation:  insertObservation,
	journalsql.InsertOwedReport:   insertOwedReport,
	journalsql.SelectOldestOwed:   selectOldestOwed,
	journalsql.DeleteOwedReport:   deleteOwedReport,
	journalsql.DeleteExpiredOwed:  deleteExpiredOwed,
	journalsql.SelectOwedRooms:    selectOwedRooms,
	journalsql.SelectRoomActivity: selectRoomActivity,

	journalsql.SelectApproval:            selectApproval,
	journalsql.SelectApprovalSource:      selectApprovalSource,
	journalsql.InsertApproval:            insertApproval,
	journalsql.DecideApprovalRow:         decideApprovalRow,
	journalsql.SelectCardApproval:        selectCardApproval,
	journalsql.SelectApprovalsForEvent:   selectApprovalsForEvent,
	journalsql.SelectOpenApprovalsInRoom: selectOpenApprovalsInRoom,
	journalsql.SelectDueApprovals:        selectDueApprovals,
	journalsql.SelectDecidedAfter:        selectDecidedAfter,
	journalsql.RetainScanVisible:         retainScanVisible,
	journalsql.RetainBodies:              retainBodies,
	journalsql.MarkPrunedBefore:          markPrunedBefore,
	journalsql.RetainEdits:               retainEdits,
	journalsql.RetainScanOutbox:          retainScanOutbox,
	journalsql.RetainPayloadBytes:        retainPayloadBytes,
	journalsql.RetainPayloads:            retainPayloads,
	journalsql.RetainTurnSources:         retainTurnSources,
	journalsql.RetainTurnRecords:         retainTurnRecords,
	journalsql.RetainRejected:            retainRejected,
	journalsql.RetainScanEvents:          retainScanEvents,
	journalsql.RetainIdentities:          retainIdentities,
	journalsql.RetainApprovals:           retainApprovals,
	journalsql.RetainDeliveries:          retainDeliveries,
	journalsql.AddRetentionTotals:        addRetentionTotals,
	journalsql.EndRetentionPassRow:       endRetentionPassRow,
	journalsql.SelectRetentionTotals:     selectRetentionTotals,
	journalsql.SelectOldestBody:          selectOldestBody,
	journalsql.SelectIdentityHorizon:     selectIdentityHorizon,
	journalsql.SelectPrunedBefore:        selectPrunedBefore,
	journalsql.StartToolRunRow:           startToolRunRow,
	journalsql.FinishToolRunRow:          finishToolRunRow,
	journalsql.DeleteOwedRoom:            deleteOwedRoom,
	journalsql.FenceVisible:              fenceVisible,
	journalsql.FenceHeldEdits:            fenceHeldEdits,
	journalsql.FenceTombstones:           fenceTombstones,
	journalsql.FenceCoverage:             fenceCoverage,
	journalsql.FenceUnattempted:          fenceUnattempted,
	journalsql.FencePendingTurnWork:      fencePendingTurnWork,

	journalsql.UpsertTurnRecord:   upsertTurn,
	journalsql.CompleteTurnRecord: completeTurnRecord,
	journalsql.DeleteTurnSources:  deleteTurnSources,
	journalsql.UpsertTurnSource:   upsertTurnSource,
	journalsql.DeleteTurn:         deleteTurn,
	journalsql.SelectTurn:         selectTurn,
	journalsql.SelectTurnByEvent:  selectTurnByEvent,
	journalsql.SelectTurnSources:  selectTurnSources,
	journalsql.SelectTurnsAfter:   selectTurnsAfter,

	journalsql.UpsertCoverage:  upsertCoverage,
	journalsql.SelectCovered:   selectCovered,
	journalsql.SelectDebt:      selectDebt,
	journalsql.SelectDebtEpoch: selectDebtEpoch,
	journalsql.InstallRevision: installRevision,

	journalsql.MarkAwaiting:         markAwaiting,
	journalsql.InsertAwaiting:       insertAwaiting,
	journalsql.SelectAwaitingRow:    selectAwaitingRow,
	journalsql.ResolveDecrypted:     resolveDecrypted,
	journalsql.InsertPayload:        insertPayload,
	journalsql.SettleUndecryptable:  settleUndecryptable,
	journalsql.DeleteAwaiting:       deleteAwaiting,
	journalsql.SelectKeyWaits:       selectKeyWaits,
	journalsql.SelectAwaitingFor:    selectAwaitingFor,
	journalsql.SelectExpiredAwaited: selectExpiredAwaited,
	journalsql.FenceAwaiting:        fenceAwaiting,
	journalsql.FenceAwaitingKeys:    fenceAwaitingKeys,

	journalsql.SelectStatus:  selectStatus,
	journalsql.SelectBacklog: selectBacklog,
}

// bind expands each journalsql.EventKey into what the identity index
// compares: the ID's hash, then the ID.
func bind(args []any) []any {
	for i, a := range args {
		if _, ok := a.(journalsql.EventKey); ok {
			return expandKeys(args, i)
		}
	}
	return args
}

func expandKeys(args []any, from int) []any {
	out := make([]any, 0, len(args)+1)
	out = append(out, args[:from]...)
	for _, a := range args[from:] {
		if k, ok := a.(journalsql.EventKey); ok {
			out = append(out, IDHash(string(k)), string(k))
			continue
		}
		out = append(out, a)
	}
	return out
}

var _ journalsql.Tx = (*Tx)(nil)

// Exec implements journalsql.Tx.
func (t *Tx) Exec(s journalsql.Stmt, args ...any) (int64, error) {
	r, err := t.exec(statements[s], bind(args)...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// QueryRow implements journalsql.Tx.
func (t *Tx) QueryRow(s journalsql.Stmt, args ...any) journalsql.Row {
	return mappedRow{t.queryRow(statements[s], bind(args)...), context.Background()}
}

// Query implements journalsql.Tx.
func (t *Tx) Query(s journalsql.Stmt, args ...any) (journalsql.Rows, error) {
	rows, err := t.query(statements[s], bind(args)...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows, context.Background()}, nil
}

// NoRows implements journalsql.Tx.
func (t *Tx) NoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }

// Now implements journalsql.Tx.
func (t *Tx) Now() time.Time { return t.now }

// Text implements journalsql.Dialect: SQLite keeps any bytes as text.
func (t *Tx) Text(s string) string { return s }

// InsertEvent implements journalsql.Dialect.
func (t *Tx) InsertEvent(p journalsql.Principal, ev *journal.Event, thread string, class journal.Class, pending bool, epoch int64) (int64, bool, error) {
	state := stateSettled
	if pending {
		state = statePending
	}
	// Exec rather than RETURNING: a query in a transaction costs
	// database/sql a goroutine, an insert does not.
	r, err := t.exec(insertJournalEvent, p.ID, IDHash(ev.ID), ev.ID, ev.RoomID, thread, ev.Target, int(ev.Kind),
		int(class), int(ev.Provenance), state, epoch, t.nowMS())
	if err != nil {
		return 0, false, err
	}
	if n, err := r.RowsAffected(); err != nil || n == 0 {
		return 0, false, err // already admitted
	}
	seq, err := r.LastInsertId()
	if err != nil {
		return 0, false, err
	}
	if pending {
		if _, err := t.exec(insertPayload, seq, string(ev.Canonical)); err != nil {
			return 0, false, err
		}
	}
	return seq, true, nil
}

// roomName names a room of a principal.
type roomName struct {
	principal int64
	room      string
}

// Room implements journalsql.Dialect: it interns room for p on first sight
// and reads its epoch. Every admitted event needs both, so they are cached
// (DB.rooms); an entry appears only once the transaction that read it has
// committed, and the fence and a join, the only things that change a
// membership, drop it (ForgetRoom).
func (t *Tx) Room(p journalsql.Principal, room string) (journalsql.RoomRef, error) {
	name := roomName{p.ID, room}
	if r, ok := t.db.rooms[name]; ok {
		return r, nil
	}
	var r journalsql.RoomRef
	err := t.queryRow(selectRoom, p.ID, room).Scan(&r.Key, &r.Epoch, &r.Departed)
	if errors.Is(err, sql.ErrNoRows) {
		res, err := t.exec(insertRoom, p.ID, room)
		if err != nil {
			return r, fmt.Errorf("intern room: %w", err)
		}
		if r.Key, err = res.LastInsertId(); err != nil {
			return r, err
		}
	} else if err != nil {
		return r, fmt.Errorf("read membership epoch: %w", err)
	}
	if t.afterCommit != nil {
		t.afterCommit(func() { t.db.rooms[name] = r })
	}
	return r, nil
}

// ForgetRoom implements journalsql.Dialect: p's room leaves the cache at
// once, for the rest of this transaction, and again after it commits,
// after whatever an earlier command of the same transaction would add.
func (t *Tx) ForgetRoom(p journalsql.Principal, room string) {
	name := roomName{p.ID, room}
	delete(t.db.rooms, name)
	if t.afterCommit != nil {
		t.afterCommit(func() { delete(t.db.rooms, name) })
	}
}

// IndexVisible implements journalsql.Dialect. A new row joins the page
// index's unmerged tail; a row rebuilt by history keeps the seq of its
// original's first admission, which a merge may long have passed, so it
// goes straight into the page index.
func (t *Tx) IndexVisible(room journalsql.RoomRef, ev *journal.Event, seq int64, rebuilt bool) error {
	if rebuilt {
		r, err := t.exec(indexRebuiltRow, room.Key, ev.Thread, ev.TS, ev.ID, seq)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil || n > 0 {
			return err
		}
	}
	return noteVisibleRow(t)
}

// sqlRows adapts database/sql's cursor. A read-only connection gives up
// waiting for a lock at its call's deadline, so a failure then reads as
// the deadline (deadlineErr).
type sqlRows struct {
	*sql.Rows
	ctx context.Context
}

// Close implements journalsql.Rows.
func (r sqlRows) Close() { _ = r.Rows.Close() }

// Err implements journalsql.Rows.
func (r sqlRows) Err() error { return deadlineErr(r.ctx, r.Rows.Err()) }

// Scan implements journalsql.Rows.
func (r sqlRows) Scan(dest ...any) error { return mapErr(r.Rows.Scan(dest...)) }

// mappedRow is a row whose error is the journal's (mapErr, deadlineErr);
// "no row" stays database/sql's, wrapped by nothing.
type mappedRow struct {
	*sql.Row
	ctx context.Context
}

// Scan implements journalsql.Row.
func (r mappedRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return deadlineErr(r.ctx, err)
}

// reader runs the shared reads on a pool of query-only connections, or
// inside one read transaction of it (a snapshot).
type reader struct {
	pool *sql.DB
	tx   *sql.Tx
}

var _ journalsql.Reader = reader{}

// Reader returns the shared reads' port over the reader pool.
func (db *DB) Reader() journalsql.Reader { return reader{pool: db.readers} }

// QueryRow implements journalsql.Reader.
func (r reader) QueryRow(ctx context.Context, s journalsql.Stmt, args ...any) journalsql.Row {
	if r.tx != nil {
		return mappedRow{r.tx.QueryRowContext(ctx, statements[s], bind(args)...), ctx}
	}
	return mappedRow{r.pool.QueryRowContext(ctx, statements[s], bind(args)...), ctx}
}

// Query implements journalsql.Reader.
func (r reader) Query(ctx context.Context, s journalsql.Stmt, args ...any) (journalsql.Rows, error) {
	var (
		rows *sql.Rows
		err  error
	)
	if r.tx != nil {
		rows, err = r.tx.QueryContext(ctx, statements[s], bind(args)...)
	} else {
		rows, err = r.pool.QueryContext(ctx, statements[s], bind(args)...)
	}
	if err != nil {
		return nil, deadlineErr(ctx, err)
	}
	return sqlRows{rows, ctx}, nil
}

// NoRows implements journalsql.Reader.
func (reader) NoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }

// Snapshot implements journalsql.Reader: one read transaction.
func (r reader) Snapshot(ctx context.Context, read func(journalsql.Reader) error) error {
	if r.tx != nil {
		return read(r)
	}
	tx, err := r.pool.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	return read(reader{pool: r.pool, tx: tx})
}
