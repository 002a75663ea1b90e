package pgfs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
)

// statements holds PostgreSQL's text of the shared work's statements.
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

// bind turns each journalsql.EventKey into the event ID it stands for:
// PostgreSQL's identity index is on the ID itself.
func bind(args []any) []any {
	for i, a := range args {
		if k, ok := a.(journalsql.EventKey); ok {
			args[i] = string(k)
		}
	}
	return args
}

var _ journalsql.Tx = (*Tx)(nil)

// Exec implements journalsql.Tx.
func (t *Tx) Exec(s journalsql.Stmt, args ...any) (int64, error) {
	tag, err := t.exec(statements[s], bind(args)...)
	return tag.RowsAffected(), err
}

// QueryRow implements journalsql.Tx.
func (t *Tx) QueryRow(s journalsql.Stmt, args ...any) journalsql.Row {
	return mappedRow{t.queryRow(statements[s], bind(args)...)}
}

// Query implements journalsql.Tx.
func (t *Tx) Query(s journalsql.Stmt, args ...any) (journalsql.Rows, error) {
	rows, err := t.query(statements[s], bind(args)...)
	if err != nil {
		return nil, err
	}
	return pgRows{rows}, nil
}

// NoRows implements journalsql.Tx.
func (t *Tx) NoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// Now implements journalsql.Tx.
func (t *Tx) Now() time.Time { return t.now }

// Text implements journalsql.Dialect: PostgreSQL keeps text only as valid
// UTF-8 without NUL, so every NUL and every invalid sequence becomes
// U+FFFD.
func (t *Tx) Text(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
}

// InsertEvent implements journalsql.Dialect in one round trip: the event
// and, when pending, its payload.
func (t *Tx) InsertEvent(p journalsql.Principal, ev *journal.Event, thread string, class journal.Class, pending bool, epoch int64) (int64, bool, error) {
	state := stateSettled
	var payload any // NULL: a settled row keeps no payload
	if pending {
		state, payload = statePending, string(ev.Canonical)
	}
	var seq int64
	err := t.queryRow(insertJournalEvent, p.ID, ev.ID, ev.RoomID, thread, ev.Target, int16(ev.Kind),
		int16(class), int16(ev.Provenance), int16(state), epoch, t.nowMS(), payload).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil // already admitted
	}
	if err != nil {
		return 0, false, mapErr(err)
	}
	return seq, true, nil
}

// Room implements journalsql.Dialect: the room is interned on first sight,
// in the statement that reads its membership.
func (t *Tx) Room(p journalsql.Principal, room string) (journalsql.RoomRef, error) {
	var r journalsql.RoomRef
	err := t.queryRow(selectRoom, p.ID, room).Scan(&r.Key, &r.Epoch, &r.Departed)
	if errors.Is(err, pgx.ErrNoRows) {
		err = t.queryRow(insertRoom, p.ID, room).Scan(&r.Key, &r.Epoch, &r.Departed)
		if err != nil {
			return r, fmt.Errorf("intern room: %w", mapErr(err))
		}
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("read membership epoch: %w", err)
	}
	return r, nil
}

// ForgetRoom implements journalsql.Dialect: nothing of a membership is
// kept outside the database.
func (t *Tx) ForgetRoom(journalsql.Principal, string) {}

// IndexVisible implements journalsql.Dialect: pages find every visible
// row through one index on the table itself.
func (t *Tx) IndexVisible(journalsql.RoomRef, *journal.Event, int64, bool) error { return nil }

// pgRows adapts pgx's cursor; its errors are the journal's (mapErr).
type pgRows struct{ pgx.Rows }

// Close implements journalsql.Rows.
func (r pgRows) Close() { r.Rows.Close() }

// Scan implements journalsql.Rows.
func (r pgRows) Scan(dest ...any) error { return mapErr(r.Rows.Scan(dest...)) }

// Err implements journalsql.Rows.
func (r pgRows) Err() error { return mapErr(r.Rows.Err()) }

// mappedRow is a row whose error is the journal's (mapErr); "no row"
// stays pgx's, wrapped by nothing.
type mappedRow struct{ pgx.Row }

// Scan implements journalsql.Row.
func (r mappedRow) Scan(dest ...any) error { return mapErr(r.Row.Scan(dest...)) }

// querier is the pool or a read transaction of it: what a read runs on.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// reader runs the shared reads on the pool, or inside one read-only
// repeatable-read transaction of it (a snapshot).
type reader struct {
	s *Store
	q querier
}

var _ journalsql.Reader = reader{}

// Reader returns the shared reads' port over the pool.
func (s *Store) Reader() journalsql.Reader { return reader{s: s, q: s.pool} }

// QueryRow implements journalsql.Reader.
func (r reader) QueryRow(ctx context.Context, s journalsql.Stmt, args ...any) journalsql.Row {
	return mappedRow{r.q.QueryRow(ctx, statements[s], bind(args)...)}
}

// Query implements journalsql.Reader.
func (r reader) Query(ctx context.Context, s journalsql.Stmt, args ...any) (journalsql.Rows, error) {
	rows, err := r.q.Query(ctx, statements[s], bind(args)...)
	if err != nil {
		return nil, mapErr(redact(err))
	}
	return pgRows{rows}, nil
}

// NoRows implements journalsql.Reader.
func (reader) NoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

// Snapshot implements journalsql.Reader.
func (r reader) Snapshot(ctx context.Context, read func(journalsql.Reader) error) error {
	if _, inTx := r.q.(pgx.Tx); inTx {
		return read(r)
	}
	tx, err := r.s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return redact(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	return read(reader{s: r.s, q: tx})
}

// Writer returns p's write port: each command is one transaction that
// first locks p's row, so p's commands commit in order while other
// principals write in parallel.
func (s *Store) Writer(p journalsql.Principal) journalsql.Writer { return principalWriter{s: s, p: p} }

type principalWriter struct {
	s *Store
	p journalsql.Principal
}

// Do implements journalsql.Writer: the command commits alone, or with
// others of the principal that arrived while one ran (group.go). A
// transaction PostgreSQL aborted as a deadlock victim or for a
// serialization conflict is run again from the start.
func (w principalWriter) Do(ctx context.Context, name string, _ int, run func(journalsql.Tx) ([]hint.Hint, error)) error {
	if err := w.s.group(ctx, w.p.ID, run); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// Register interns a principal and returns it with its row ID, the
// existing row's if any.
func (s *Store) Register(ctx context.Context, jp journal.Principal) (journalsql.Principal, error) {
	var id int64
	if err := s.pool.QueryRow(ctx, insertPrincipal, jp.Agent, jp.UserID).Scan(&id); err != nil {
		return journalsql.Principal{}, fmt.Errorf("register principal: %w", redact(err))
	}
	return journalsql.Principal{Principal: jp, ID: id}, nil
}
