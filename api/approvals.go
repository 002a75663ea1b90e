package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mindroomd/mindroomd/journal"
)

// DefaultApprovalExpiry is how long an approval stays open when the
// request names no expiry.
const DefaultApprovalExpiry = time.Hour

// approvalRequest asks a person to approve one exact call before it runs.
type approvalRequest struct {
	// CallID names the call, chosen by the agent: the same ID with the same
	// call is the same request.
	CallID string `json:"call_id"`
	// Tool and Arguments (a JSON object) are the exact call.
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	// Approvers may decide (Matrix user IDs); absent or empty: the event's
	// sender.
	Approvers []string `json:"approvers"`
	// ExpiresInS or ExpiresAtMS (unix milliseconds), one of them: when an
	// undecided call expires. Default DefaultApprovalExpiry from now.
	ExpiresInS  *int64 `json:"expires_in_s"`
	ExpiresAtMS *int64 `json:"expires_at_ms"`
	// Secret names arguments never shown on the card.
	Secret []string `json:"secret"`
	// Rendering, optional, is the agent's own words for the call, shown on
	// the card above it.
	Rendering string `json:"rendering"`
	// Context, optional, is the agent's own state (any JSON value, within
	// the request's 64 KiB), kept with the request and shown with it, so an
	// agent that restarts resumes from it.
	Context json.RawMessage `json:"context"`
}

// approvalResponse answers an approval request.
type approvalResponse struct {
	CallID  string `json:"call_id"`
	EventID string `json:"event_id"`
	// State is open until a decision: approved, denied, expired or
	// withdrawn.
	State string `json:"state"`
	// Outcome is created (recorded now, its card queued) or replayed (the
	// same call was asked for before; nothing new is queued).
	Outcome string `json:"outcome"`
	// CardDeliveryID is the outbox row that sends the card.
	CardDeliveryID string   `json:"card_delivery_id"`
	Approvers      []string `json:"approvers"`
	ExpiresAtMS    int64    `json:"expires_at_ms"`
}

// approvalView is an approval as the API shows it.
type approvalView struct {
	CallID    string          `json:"call_id"`
	EventID   string          `json:"event_id"`
	RoomID    string          `json:"room_id"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Secret    []string        `json:"secret"`
	Approvers []string        `json:"approvers"`
	State     string          `json:"state"`
	// DecidedBy is the approver who decided ("" while open, and for an
	// expiry or a withdrawal); DecisionEventID the vote that decided.
	DecidedBy       string `json:"decided_by"`
	DecisionEventID string `json:"decision_event_id"`
	DecidedAtMS     int64  `json:"decided_at_ms"`
	// Reason says why an approval expired or was withdrawn.
	Reason string `json:"reason"`
	// CardEventID is the card's event once the homeserver acknowledged
	// it, "" before.
	CardEventID string `json:"card_event_id"`
	CreatedAtMS int64  `json:"created_at_ms"`
	ExpiresAtMS int64  `json:"expires_at_ms"`
	// Context is the agent's own state as it asked, absent when it kept
	// none.
	Context json.RawMessage `json:"context,omitempty"`
}

// approvalAnswer is one approval read, perhaps after a wait.
type approvalAnswer struct {
	approvalView
	// TimedOut is true when a wait ended with the approval still open.
	TimedOut bool `json:"timed_out"`
}

func viewApproval(a journal.Approval, cardEventID string) approvalView {
	v := approvalView{CallID: a.CallID, EventID: a.EventID, RoomID: a.RoomID, Tool: a.Tool, Arguments: a.Arguments,
		Secret: a.Secret, Approvers: a.Approvers, State: a.State.String(), DecidedBy: a.DecidedBy,
		DecisionEventID: a.DecisionEventID, DecidedAtMS: a.DecidedMS, Reason: a.Reason, CardEventID: cardEventID,
		CreatedAtMS: a.CreatedMS, ExpiresAtMS: a.ExpiresMS, Context: a.Context}
	if v.Secret == nil {
		v.Secret = []string{}
	}
	if v.Approvers == nil {
		v.Approvers = []string{}
	}
	if v.Arguments == nil {
		v.Arguments = json.RawMessage("{}")
	}
	return v
}

// requestApproval records a request for a person's approval of one exact
// call, and queues its card, in one transaction. Idempotent by call ID: the
// same call again is the recorded request (whatever its other fields), a
// different call under the same ID a conflict. Nothing is stored when the
// request is refused.
func (s *server) requestApproval(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	eventID := r.PathValue("event_id")
	if !journal.ValidEventID(eventID) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "event_id is not an event ID")
		return
	}
	var req approvalRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if !validCallID(req.CallID) {
		writeError(w, http.StatusBadRequest, codeBadRequest,
			fmt.Sprintf("call_id must be 1 to %d bytes of printable text, not . or ..", journal.MaxCallIDBytes))
		return
	}
	if args := bytes.TrimSpace(req.Arguments); len(args) == 0 || args[0] != '{' {
		writeError(w, http.StatusBadRequest, codeBadRequest, "arguments is required: one JSON object")
		return
	}
	expires, err := s.approvalExpiry(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	// One request of a call ID at a time: the check for an earlier request
	// and the record of this one never interleave with another's.
	defer s.lock(name, journal.ApprovalDeliveryID(req.CallID))()
	ap, outcome, err := a.Store.RequestApproval(r.Context(), journal.ApprovalRequest{EventID: eventID,
		CallID: req.CallID, Tool: req.Tool, Arguments: req.Arguments, Secret: req.Secret, Approvers: req.Approvers,
		ExpiresMS: expires, Rendering: req.Rendering, Context: req.Context}, a.approvalKeys())
	if err != nil {
		s.failApproval(w, r, name, err)
		return
	}
	res := approvalResponse{CallID: ap.CallID, EventID: ap.EventID, State: ap.State.String(), Outcome: "created",
		CardDeliveryID: journal.ApprovalDeliveryID(ap.CallID), Approvers: ap.Approvers, ExpiresAtMS: ap.ExpiresMS}
	if outcome == journal.ApprovalReplayed {
		res.Outcome = "replayed"
	}
	if res.Approvers == nil {
		res.Approvers = []string{}
	}
	writeJSON(w, http.StatusOK, res)
}

// approvalExpiry is the expiry a request asks for, in unix milliseconds:
// expires_at_ms, or expires_in_s (default DefaultApprovalExpiry) from now;
// in the future and at most journal.MaxApprovalWindow ahead.
func (s *server) approvalExpiry(req approvalRequest) (int64, error) {
	now := s.now()
	maxIn := int64(journal.MaxApprovalWindow / time.Second)
	var at int64
	switch {
	case req.ExpiresInS != nil && req.ExpiresAtMS != nil:
		return 0, errors.New("give expires_in_s or expires_at_ms, not both")
	case req.ExpiresAtMS != nil:
		at = *req.ExpiresAtMS
	case req.ExpiresInS != nil && (*req.ExpiresInS <= 0 || *req.ExpiresInS > maxIn):
		// Bounded before the conversion, which could overflow.
		return 0, fmt.Errorf("expires_in_s must be from 1 to %d", maxIn)
	case req.ExpiresInS != nil:
		at = now.Add(time.Duration(*req.ExpiresInS) * time.Second).UnixMilli()
	default:
		at = now.Add(DefaultApprovalExpiry).UnixMilli()
	}
	if err := journal.ValidExpiry(at, now); err != nil {
		return 0, err
	}
	return at, nil
}

// failApproval answers a refused approval request or read.
func (s *server) failApproval(w http.ResponseWriter, r *http.Request, name string, err error) {
	switch {
	case errors.Is(err, journal.ErrUnknownSource):
		writeError(w, http.StatusNotFound, codeNotFound, "the agent never admitted this event")
	case errors.Is(err, journal.ErrCallConflict):
		writeError(w, http.StatusConflict, codeConflict, "the call_id was used for a different call (another tool, arguments or event)")
	case errors.Is(err, journal.ErrNotPending):
		writeError(w, http.StatusConflict, codeConflict, "the event is no longer pending")
	case journal.DropsTurn(err):
		writeError(w, http.StatusConflict, codeConflict, "the membership the event came under has ended")
	default:
		s.fail(w, r, name, err)
	}
}

// approval reads one approval of an event. With wait, an open approval is
// waited on: the answer comes as soon as it is decided, or still open with
// timed_out once wait has passed.
func (s *server) approval(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	eventID, callID := r.PathValue("event_id"), r.PathValue("call_id")
	switch {
	case !journal.ValidEventID(eventID):
		writeError(w, http.StatusBadRequest, codeBadRequest, "event_id is not an event ID")
		return
	case !validCallID(callID):
		writeError(w, http.StatusBadRequest, codeBadRequest,
			fmt.Sprintf("call_id must be 1 to %d bytes of printable text, not . or ..", journal.MaxCallIDBytes))
		return
	}
	wait, err := parseWait(r.URL.Query().Get("wait"))
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	longPoll(r.Context(), a, wait, func(last bool) bool {
		ap, card, found, err := a.Store.Approval(r.Context(), callID)
		switch {
		case err != nil:
			s.fail(w, r, name, err)
			return true
		case !found || ap.EventID != eventID:
			writeError(w, http.StatusNotFound, codeNotFound, "no approval of this event has this call_id")
			return true
		}
		open := ap.State == journal.ApprovalOpen
		if open && !last {
			return false
		}
		writeJSON(w, http.StatusOK, approvalAnswer{approvalView: viewApproval(ap, card), TimedOut: open && wait > 0})
		return true
	})
}

// listApprovals lists the approvals of one event, oldest first.
func (s *server) listApprovals(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	eventID := r.PathValue("event_id")
	if !journal.ValidEventID(eventID) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "event_id is not an event ID")
		return
	}
	ctx := r.Context()
	_, seen, err := a.Store.AdmittedEvent(ctx, eventID)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	if !seen {
		writeError(w, http.StatusNotFound, codeNotFound, "the agent never admitted this event")
		return
	}
	list, err := a.Store.ApprovalsForEvent(ctx, eventID)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	items := make([]approvalView, 0, len(list))
	for _, ap := range list {
		// Read again for the card's event; the fresher row is shown.
		fresh, card, found, err := a.Store.Approval(ctx, ap.CallID)
		if err != nil {
			s.fail(w, r, name, err)
			return
		}
		if found {
			ap = fresh
		}
		items = append(items, viewApproval(ap, card))
	}
	writeJSON(w, http.StatusOK, map[string]any{"event_id": eventID, "approvals": items})
}

// validCallID reports whether v can be a call ID: 1 to
// journal.MaxCallIDBytes bytes of UTF-8 without control characters, and
// not "." or "..", which no path can carry to the route that reads it.
func validCallID(v string) bool {
	if v == "" || v == "." || v == ".." || len(v) > journal.MaxCallIDBytes || !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
