package journalsql

// Stmt names one statement of the shared work. Each dialect keeps the
// statement's text in a table indexed by Stmt, written from constants, so
// the Go around a statement is written once while its SQL may differ. The
// comment on each names its arguments in order; an EventKey argument is
// bound as the dialect's identity index needs.
type Stmt int

// The statements.
const (
	// Admission and the journal.

	SelectThreadOf      Stmt = iota // (principal, EventKey, room) → thread_id
	SelectJournaledSeq              // (principal, EventKey, room) → seq, thread_id
	SettleEvent                     // (principal, EventKey); drops the payload
	SettleEventInRoom               // (principal, EventKey, room)
	InsertRejected                  // (principal, room, event_id, fingerprint, reason, raw, received_ms)
	UpdateSyncToken                 // (token, ms, principal)
	SelectPending                   // (principal, after seq, limit) → seq, event_id, room_id, kind, epoch, payload
	SelectAdmittedEvent             // (principal, EventKey) → room_id, thread_id, pending
	SelectSyncToken                 // (principal) → sync_token
	SelectSyncTokenMS               // (principal) → sync_token_ms
	SelectPrincipalID               // (agent, user_id) → id
	InsertPrincipal                 // (agent, user_id) → id, of the existing row if any

	// The visible-message projection.

	SelectTombstone       // (principal, room, event_id) → exists
	ProbeOriginal         // (principal, room, event_id) → tombstoned, held
	InsertTombstone       // (principal, room, event_id, redaction seq)
	SelectVisibleByEvent  // (principal, EventKey, room) → seq, sender, revision_id, revision_ts
	InsertVisible         // (seq, room key, thread, event_id, sender, created_ts, stored revision_id, revision_ts, content, refresh_token, epoch)
	UpdateVisibleRevision // (revision_id, revision_ts, content, refresh_token, seq)
	DeleteVisible         // (seq)
	ClearVisibleOnEdit    // (refresh_token, seq, revision_id)
	SelectHeldEdit        // (principal, room, target, sender) → edit_id, edit_ts, content
	UpsertHeldEdit        // (principal, room, target, sender, edit_id, edit_ts, content, epoch)
	DeleteHeldEdits       // (principal, room, target)
	TakeHeldEdits         // (principal, room, target) → sender, edit_id, edit_ts, content, taking them
	ClearHeldEdit         // (principal, room, edit_id)
	SelectJournalEdit     // (principal, EventKey, room) → target_id, of an edit
	ProbeJournaled        // (principal, EventKey, room) → thread_id, of an event not awaiting its key

	// The outbox. Rows read are in scanDelivery's column order.

	SelectDelivery       // (principal, delivery_id, stage) → a delivery
	SelectRetiredStage   // (principal, delivery_id) → exists
	SelectSource         // (principal, EventKey) → room_id, epoch
	InsertDelivery       // (principal, delivery_id, stage, room, thread, txn_id, turn_id, event_type, payload, epoch, created_ms, updated_ms)
	UpdateQueuedDelivery // (room, thread, turn_id, event_type, payload, epoch, updated_ms, id); only while never attempted
	ClaimDelivery        // (device_id, replaces_event_id, updated_ms, id); a recorded device stays
	RetireDelivery       // (updated_ms, id)
	MoveDevice           // (device_id, updated_ms, id)
	AckDelivery          // (event_id, updated_ms, id)
	FailDelivery         // (permanent, reason, updated_ms, id); an acknowledged or retired row keeps its state
	SelectUnackedHead    // (principal, limit) → deliveries
	SelectUnackedAfter   // (principal, created_ms, id, limit) → deliveries after the cursor
	SelectDeliveredEvent // (principal, room, event_id) → exists, as an acknowledged row's event

	// Membership and the fence.

	SelectMembership     // (principal, room) → epoch, departed
	UpsertDeparture      // (principal, room); the epoch moves on
	UpsertJoin           // (principal, room)
	InsertObservation    // (principal, observation_id, room); nothing when seen before
	InsertOwedReport     // (principal, room, owed_ms)
	SelectOldestOwed     // (principal, room, since ms) → id
	DeleteOwedReport     // (id)
	DeleteExpiredOwed    // (principal, room, before ms)
	SelectOwedRooms      // (principal) → room_id
	SelectRoomActivity   // (principal) → room_id, epoch, departed, newest room-level created_ts (0 for none), pending count
	DeleteOwedRoom       // (principal, room)
	FenceVisible         // (principal, room)
	FenceHeldEdits       // (principal, room)
	FenceTombstones      // (principal, room)
	FenceCoverage        // (principal, room)
	FenceUnattempted     // (updated_ms, principal, room)
	FencePendingTurnWork // (principal, room)

	// Tool approvals. Rows read are in scanApproval's column order.

	SelectApproval            // (principal, call_id) → an approval
	SelectApprovalSource      // (principal, EventKey) → room_id, thread_id, pending, payload ('' when settled)
	InsertApproval            // (principal, call_id, event_id, room, thread, tool, arguments, secret, approvers, rendering, call_hash, card_delivery_id, expires_ms, epoch, created_ms, context)
	DecideApprovalRow         // (state, decided_by, decision_event_id, decided_ms, reason, principal, call_id); only while open, taking the next decided_seq
	SelectCardApproval        // (principal, card event_id) → an approval
	SelectApprovalsForEvent   // (principal, event_id) → approvals, oldest first
	SelectOpenApprovalsInRoom // (principal, room) → open approvals
	SelectDueApprovals        // (principal, now_ms, limit) → open approvals expiring by now, soonest first
	SelectDecidedAfter        // (principal, after decided_seq, limit) → approvals and their decided_seq, in decision order
	StartToolRunRow           // (principal, call_id); only an approved call never started
	FinishToolRunRow          // (result, principal, call_id); only a started run

	// Turn records.

	UpsertTurnRecord   // (agent, turn_id, room, state, record, event_id, updated_ms)
	CompleteTurnRecord // (event_id, updated_ms, agent, turn_id)
	DeleteTurnSources  // (agent, turn_id)
	UpsertTurnSource   // (agent, event_id, turn_id)
	DeleteTurn         // (agent, turn_id)
	SelectTurn         // (agent, turn_id) → a turn
	SelectTurnByEvent  // (agent, event_id) → a turn
	SelectTurnSources  // (agent, turn_id) → event_id, in order
	SelectTurnsAfter   // (agent, after turn_id, limit) → turns

	// Hydration.

	UpsertCoverage  // (principal, room, thread, epoch, covered_ms)
	SelectCovered   // (principal, room, thread) → covered
	SelectDebt      // (principal, EventKey, room) → seq, sender, revision_id, revision_ts, refresh token
	SelectDebtEpoch // (principal, EventKey, room) → refresh token, epoch, departed
	InstallRevision // (revision_id, revision_ts, content, seq)

	// Encrypted events awaiting their keys.

	MarkAwaiting         // (seq); the journal row waits for its key
	InsertAwaiting       // (seq, principal, room, session_id, event, received_ms)
	SelectAwaitingRow    // (principal, seq) → room_id, epoch, provenance; only while awaiting
	ResolveDecrypted     // (kind, class, thread_id, target_id, state, principal, seq)
	InsertPayload        // (seq, payload)
	SettleUndecryptable  // (principal, seq)
	DeleteAwaiting       // (principal, seq)
	SelectKeyWaits       // (principal, limit) → room_id, session_id
	SelectAwaitingFor    // (principal, room, session_id, limit) → seq, event_id, provenance, event, received_ms
	SelectExpiredAwaited // (principal, cutoff ms, limit) → seq
	FenceAwaiting        // (principal, room); the journal rows settle
	FenceAwaitingKeys    // (principal, room); the ciphertexts go

	// Retention. A scan reads (key, age) in key order; a range statement
	// prunes (principal, after key, upto key, cutoff ms] under its guards.

	RetainScanVisible     // (principal, after seq, limit) → seq, received_ms of the visible rows
	RetainBodies          // (principal, after, upto) → room key, created_ts, content bytes of each row removed
	MarkPrunedBefore      // (created_ts, room key); keeps the newest
	RetainEdits           // (principal, cutoff, limit); unresolved edits older than the cutoff
	RetainScanOutbox      // (principal, after id, limit) → id, created_ms
	RetainPayloadBytes    // (principal, after, upto, cutoff) → rows, bytes of the payloads RetainPayloads clears
	RetainPayloads        // (principal, after, upto, cutoff); finished deliveries' content cleared
	RetainTurnSources     // (agent, cutoff, limit); the sources of the turns RetainTurnRecords removes
	RetainTurnRecords     // (agent, cutoff, limit); answered turns' records
	RetainRejected        // (principal, cutoff, limit)
	RetainScanEvents      // (principal, after seq, limit) → seq, received_ms
	RetainIdentities      // (principal, after, upto, cutoff); settled events with no visible row and no ciphertext waiting
	RetainApprovals       // (principal, cutoff, limit); decided approvals whose turn and card edit are done
	RetainDeliveries      // (principal, after, upto, cutoff); finished deliveries whose siblings are finished and whose approval is gone
	AddRetentionTotals    // (principal, bodies, edits, payloads, turns, rejected, identities, deliveries, approvals, bytes)
	EndRetentionPassRow   // (principal, now_ms, identities cutoff)
	SelectRetentionTotals // (principal) → passes, last_pass_ms, the totals, identities_before_ms
	SelectOldestBody      // (principal) → the oldest visible created_ts, 0 for none
	SelectPrunedBefore    // (principal, room) → pruned_before
	SelectIdentityHorizon // (principal) → identities_before_ms

	// Operator reads.

	SelectStatus  // () → journal.PrincipalStatus's figures, one row per principal
	SelectBacklog // () → agent, user_id, pending, queued, attempted

	// NumStmts counts the statements: a dialect's table has this length.
	NumStmts
)

// Missing lists the statements a dialect's table leaves without text; a
// dialect's test requires none.
func Missing(table *[NumStmts]string) []Stmt {
	var missing []Stmt
	for s := range NumStmts {
		if table[s] == "" {
			missing = append(missing, s)
		}
	}
	return missing
}
