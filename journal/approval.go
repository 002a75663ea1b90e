package journal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The rules of tool approvals: an agent asks a person before an exact call
// (a tool and its arguments) runs. The request is stored with a card, a
// message in the event's thread that says what would run and how to decide;
// a listed approver decides by reacting to the card or replying to it; the
// first valid decision is written once and never changes; the card is then
// edited once to show it. Everything here is pure: the stores keep the
// ledger, the principal judges what the room says against these rules.

// Approval bounds.
const (
	// MaxCallIDBytes bounds a call ID.
	MaxCallIDBytes = 128
	// MaxToolBytes bounds a tool's name.
	MaxToolBytes = 128
	// MaxApprovers bounds the approvers of one call.
	MaxApprovers = 20
	// MaxApprovalWindow bounds how far ahead an approval may expire.
	MaxApprovalWindow = 7 * 24 * time.Hour
	// MaxRenderingBytes bounds a request's own rendering of the call.
	MaxRenderingBytes = 4 << 10
	// ApprovalKey is the content key that marks a card with its call.
	ApprovalKey = "io.mindroomd.approval"
	// MaxApprovalContextBytes bounds the state an agent keeps with a
	// request (ApprovalRequest.Context).
	MaxApprovalContextBytes = 256 << 10
	// MaxToolResultBytes bounds what a tool run's record keeps of its
	// result.
	MaxToolResultBytes = 64 << 10
)

// Approval errors.
var (
	// ErrCallConflict refuses a call ID already asked for a different call.
	ErrCallConflict = errors.New("the call ID names a different call")
	// ErrNoApproval reports a call ID never asked for.
	ErrNoApproval = errors.New("no such approval")
	// ErrNotPending refuses a request for an event that no longer owes its
	// turn.
	ErrNotPending = errors.New("event not pending")
	// ErrNotApproved refuses to run a call nobody approved.
	ErrNotApproved = errors.New("the call is not approved")
)

// ApprovalState is where an approval is.
type ApprovalState uint8

// Approval states. Every state but ApprovalOpen is a decision, terminal.
const (
	ApprovalOpen      ApprovalState = 0
	ApprovalApproved  ApprovalState = 1
	ApprovalDenied    ApprovalState = 2
	ApprovalExpired   ApprovalState = 3
	ApprovalWithdrawn ApprovalState = 4
)

// String implements fmt.Stringer.
func (s ApprovalState) String() string {
	switch s {
	case ApprovalOpen:
		return "open"
	case ApprovalApproved:
		return "approved"
	case ApprovalDenied:
		return "denied"
	case ApprovalExpired:
		return "expired"
	case ApprovalWithdrawn:
		return "withdrawn"
	}
	return fmt.Sprintf("approval_state(%d)", uint8(s))
}

// ApprovalRequest is what an agent asks a person to decide.
type ApprovalRequest struct {
	// EventID is the pending event whose turn the call belongs to.
	EventID string
	// CallID names the call, chosen by the agent: the same ID again is the
	// same request.
	CallID string
	// Tool and Arguments are the exact call. Arguments is a JSON object.
	Tool      string
	Arguments json.RawMessage
	// Secret names arguments never shown on the card.
	Secret []string
	// Approvers may decide (Matrix user IDs); empty means the event's
	// sender.
	Approvers []string
	// ExpiresMS is when an undecided call is decided as expired, in unix
	// milliseconds.
	ExpiresMS int64
	// Rendering, optional, is the agent's own words for the call, shown
	// above it.
	Rendering string
	// Context, optional, is the agent's own state at the moment it asked
	// (one JSON value), kept with the request and handed back with the
	// decision, so an agent resumes from it rather than compute it again.
	// It is not part of the call: asking again with other context is the
	// same request, and the recorded context stays.
	Context json.RawMessage
}

// ToolRunState is where the run of an approved call is, for an agent that
// has the daemon run its tools: a run is claimed before it starts, so a
// crash in the middle never runs the call a second time.
type ToolRunState uint8

// Tool run states.
const (
	// ToolRunNone: the call has not been started.
	ToolRunNone ToolRunState = 0
	// ToolRunStarted: the call was claimed and started; no result was
	// recorded. Found so after a restart, it may or may not have finished.
	ToolRunStarted ToolRunState = 1
	// ToolRunFinished: the call ran and its result is recorded.
	ToolRunFinished ToolRunState = 2
)

// Approval is a request as the ledger holds it.
type Approval struct {
	ApprovalRequest
	RoomID string
	// Thread is the event's thread, nil for the room.
	Thread *string
	// CallHash identifies the exact call (CallHash).
	CallHash string
	// Epoch is the membership the request was made under.
	Epoch     int64
	CreatedMS int64
	State     ApprovalState
	// DecidedBy is who decided (an approver, or "" for an expiry or a
	// withdrawal); DecisionEventID the reaction or reply that decided.
	DecidedBy       string
	DecisionEventID string
	DecidedMS       int64
	// Reason says why an approval was withdrawn or expired.
	Reason string
	// Run is where the run of an approved call is, and RunResult what it
	// returned once finished.
	Run       ToolRunState
	RunResult string
}

// ApprovalDeliveryID names the card of callID: its initial stage is the
// card, its final stage the card's one edit showing the decision.
func ApprovalDeliveryID(callID string) string { return "approval:" + keyDigest(callID) }

// CallHash is the identity of an exact call: the SHA-256 of the canonical
// JSON of the tool and its arguments. Two spellings of the same arguments
// (key order, spacing) are one call.
func CallHash(tool string, arguments json.RawMessage) (string, error) {
	v, err := decodeJSON(arguments)
	if _, ok := v.(map[string]any); err != nil || !ok {
		return "", fmt.Errorf("%w: arguments must be one JSON object", ErrInvalidArgument)
	}
	canon, err := encodeCanonical(map[string]any{"tool": tool, "arguments": v})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}

// ValidateApproval refuses a request the ledger must not take: each field
// is checked before anything is stored, and the expiry must be after now.
// How far ahead a caller may set it is the caller's rule (ValidExpiry).
func ValidateApproval(r ApprovalRequest, now time.Time) error {
	switch {
	case !ValidEventID(r.EventID):
		return fmt.Errorf("%w: event_id is not an event ID", ErrInvalidArgument)
	case r.CallID == "" || len(r.CallID) > MaxCallIDBytes || !printable(r.CallID):
		return fmt.Errorf("%w: call_id must be 1 to %d bytes of printable text", ErrInvalidArgument, MaxCallIDBytes)
	case r.Tool == "" || len(r.Tool) > MaxToolBytes || !printable(r.Tool) || strings.ContainsAny(r.Tool, " \t"):
		return fmt.Errorf("%w: tool must be 1 to %d bytes of text without spaces", ErrInvalidArgument, MaxToolBytes)
	case len(r.Approvers) > MaxApprovers:
		return fmt.Errorf("%w: at most %d approvers", ErrInvalidArgument, MaxApprovers)
	case r.ExpiresMS <= now.UnixMilli():
		return fmt.Errorf("%w: expires is not in the future", ErrInvalidArgument)
	case len(r.Rendering) > MaxRenderingBytes:
		return fmt.Errorf("%w: rendering is larger than %d bytes", ErrInvalidArgument, MaxRenderingBytes)
	case len(r.Context) > MaxApprovalContextBytes:
		return fmt.Errorf("%w: context is larger than %d bytes", ErrInvalidArgument, MaxApprovalContextBytes)
	case r.Context != nil && !json.Valid(r.Context):
		return fmt.Errorf("%w: context is not JSON", ErrInvalidArgument)
	}
	for _, a := range r.Approvers {
		if !ValidUserID(a) {
			return fmt.Errorf("%w: approver %q is not a Matrix user ID", ErrInvalidArgument, a)
		}
	}
	if _, err := CallHash(r.Tool, r.Arguments); err != nil {
		return err
	}
	return nil
}

// ValidExpiry refuses an expiry a caller may not ask for: not after now,
// or more than MaxApprovalWindow ahead.
func ValidExpiry(expiresMS int64, now time.Time) error {
	switch {
	case expiresMS <= now.UnixMilli():
		return fmt.Errorf("%w: expires is not in the future", ErrInvalidArgument)
	case expiresMS > now.Add(MaxApprovalWindow).UnixMilli():
		return fmt.Errorf("%w: expires is more than %s ahead", ErrInvalidArgument, MaxApprovalWindow)
	}
	return nil
}

// ApprovalKeys are the reaction keys that decide.
type ApprovalKeys struct{ Approve, Deny string }

// DefaultApprovalKeys are ✅ and ❌.
var DefaultApprovalKeys = ApprovalKeys{Approve: "✅", Deny: "❌"}

// maxShownArgument bounds one argument's value on a card.
const maxShownArgument = 300

// CardContent is the card of a: the call rendered for people (tool,
// arguments with the secret ones hidden, who may decide, until when) and
// how to decide, marked with the call so the card can be told apart. It is
// a notice, so no agent takes it for work, in the event's thread when it
// has one, as a reply to the event.
func CardContent(a Approval, keys ApprovalKeys) (json.RawMessage, error) {
	var b strings.Builder
	if a.Rendering != "" {
		b.WriteString(a.Rendering + "\n\n")
	}
	fmt.Fprintf(&b, "Approval needed to run %s", a.Tool)
	args, err := shownArguments(a.Arguments, a.Secret)
	if err != nil {
		return nil, err
	}
	if args != "" {
		b.WriteString(" with\n" + args)
	} else {
		b.WriteString(" (no arguments)\n")
	}
	fmt.Fprintf(&b, "\nWho may decide: %s\n", strings.Join(a.Approvers, ", "))
	fmt.Fprintf(&b, "Until: %s\n", time.UnixMilli(a.ExpiresMS).UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "React %s to approve or %s to deny, or reply \"approve\" or \"deny\".", keys.Approve, keys.Deny)
	content := map[string]any{"msgtype": "m.notice", "body": b.String(),
		ApprovalKey: map[string]string{"call_id": a.CallID, "call_hash": a.CallHash}}
	raw, err := json.Marshal(content)
	if err != nil {
		return nil, err
	}
	raw, err = RelateReply(raw, a.EventID, a.Thread, ReplyPlain)
	if err != nil {
		return nil, err
	}
	if len(raw) > MaxContentBytes {
		return nil, fmt.Errorf("%w: the card would be larger than 64 KiB", ErrInvalidArgument)
	}
	return raw, nil
}

// shownArguments renders arguments one per line, sorted by name, each value
// as JSON cut at maxShownArgument bytes, a secret one as "(secret)".
func shownArguments(arguments json.RawMessage, secret []string) (string, error) {
	var args map[string]json.RawMessage
	if err := json.Unmarshal(arguments, &args); err != nil {
		return "", fmt.Errorf("%w: arguments must be one JSON object", ErrInvalidArgument)
	}
	names := make([]string, 0, len(args))
	for n := range args {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		v := string(args[n])
		if slices.Contains(secret, n) {
			v = "(secret)"
		} else if len(v) > maxShownArgument {
			v = strings.ToValidUTF8(v[:maxShownArgument], "") + "…"
		}
		fmt.Fprintf(&b, "  %s: %s\n", n, v)
	}
	return b.String(), nil
}

// DecisionContent is the card's one edit once a is decided: the same
// card, its decision said first.
func DecisionContent(a Approval) (json.RawMessage, error) {
	var verdict string
	switch a.State {
	case ApprovalApproved:
		verdict = "Approved by " + a.DecidedBy
	case ApprovalDenied:
		verdict = "Denied by " + a.DecidedBy
	case ApprovalExpired:
		verdict = "Expired: nobody decided in time"
	case ApprovalWithdrawn:
		verdict = "Withdrawn"
		if a.Reason != "" {
			verdict += ": " + a.Reason
		}
	default:
		return nil, fmt.Errorf("%w: an open approval has no decision to show", ErrInvalidArgument)
	}
	args, err := shownArguments(a.Arguments, a.Secret)
	if err != nil {
		return nil, err
	}
	body := fmt.Sprintf("%s. The call: %s\n%s", verdict, a.Tool, args)
	return json.Marshal(map[string]any{"msgtype": "m.notice", "body": body,
		ApprovalKey: map[string]string{"call_id": a.CallID, "call_hash": a.CallHash, "state": a.State.String()}})
}

// Vote is what one event of the room says of a card.
type Vote struct {
	// Card is the event the vote answers: a reaction's target, a reply's
	// m.in_reply_to.
	Card   string
	Sender string
	// Approve is the vote: true approves, false denies.
	Approve bool
}

// ReadVote reads what e says of a card, if anything: a reaction with one
// of keys, or a reply whose text is "approve" or "deny" (any case, white
// space and a final full stop ignored). Anything else is no vote.
func ReadVote(e Event, keys ApprovalKeys) (Vote, bool) {
	switch e.Kind {
	case KindReaction:
		var c struct {
			Relates struct {
				Key string `json:"key"`
			} `json:"m.relates_to"`
		}
		if json.Unmarshal(e.Content, &c) != nil {
			return Vote{}, false
		}
		switch c.Relates.Key {
		case keys.Approve:
			return Vote{Card: e.Target, Sender: e.Sender, Approve: true}, e.Target != ""
		case keys.Deny:
			return Vote{Card: e.Target, Sender: e.Sender}, e.Target != ""
		}
	case KindMessage:
		var c struct {
			Body    string `json:"body"`
			Relates struct {
				InReplyTo struct {
					EventID string `json:"event_id"`
				} `json:"m.in_reply_to"`
			} `json:"m.relates_to"`
		}
		if json.Unmarshal(e.Content, &c) != nil || c.Relates.InReplyTo.EventID == "" {
			return Vote{}, false
		}
		word := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(lastLine(c.Body)), "."))
		switch word {
		case "approve", "approved", "yes":
			return Vote{Card: c.Relates.InReplyTo.EventID, Sender: e.Sender, Approve: true}, true
		case "deny", "denied", "no":
			return Vote{Card: c.Relates.InReplyTo.EventID, Sender: e.Sender}, true
		}
	}
	return Vote{}, false
}

// lastLine is a reply's own text: a reply's fallback quotes the card in
// lines starting with "> " before it.
func lastLine(body string) string {
	lines := strings.Split(strings.TrimSpace(body), "\n")
	return lines[len(lines)-1]
}

// VoteOutcome is what a vote does to an approval.
type VoteOutcome uint8

// Vote outcomes.
const (
	// VoteDecides: the vote is the approval's decision.
	VoteDecides VoteOutcome = iota + 1
	// VoteConsumed: the approval was decided before; the vote changes
	// nothing.
	VoteConsumed
	// VoteIgnored: the voter may not decide (not an approver, or not in
	// the room), or the vote came too late.
	VoteIgnored
)

// JudgeVote decides what v does to a, whose card the homeserver
// acknowledged as cardEventID: only a listed approver who is a member of
// the room decides, only an open approval before its expiry, and only by
// a vote on that card. The first decision wins; every later vote is
// consumed.
func JudgeVote(a Approval, cardEventID string, v Vote, member bool, nowMS int64) VoteOutcome {
	switch {
	case cardEventID == "" || v.Card != cardEventID:
		return VoteIgnored
	case a.State != ApprovalOpen:
		return VoteConsumed
	case !slices.Contains(a.Approvers, v.Sender) || !member:
		return VoteIgnored
	case nowMS >= a.ExpiresMS:
		return VoteIgnored
	}
	return VoteDecides
}

// ApprovalDecision is a decision as the ledger writes it.
type ApprovalDecision struct {
	State ApprovalState
	// By is the approver who decided; "" for an expiry or a withdrawal.
	By string
	// EventID is the vote that decided, if one did.
	EventID string
	// Reason says why an approval was withdrawn or expired.
	Reason string
	// Settle are events settled with the decision: the vote, which is
	// never work for the agent.
	Settle []string
}

// ApprovalOutcome says what a request did.
type ApprovalOutcome uint8

// Approval request outcomes.
const (
	// ApprovalCreated recorded the request and enqueued its card.
	ApprovalCreated ApprovalOutcome = iota + 1
	// ApprovalReplayed found the same request recorded.
	ApprovalReplayed
)

// Approvals is the tool-approval ledger of one principal.
type Approvals interface {
	// RequestApproval records a request and enqueues its card in one
	// transaction; the same call ID with the same call is the recorded
	// request (ApprovalReplayed), with another call ErrCallConflict.
	RequestApproval(ctx context.Context, req ApprovalRequest, keys ApprovalKeys) (Approval, ApprovalOutcome, error)
	// DecideApproval writes a decision once: decided is false when the
	// approval was decided before (the vote is then consumed). The card's
	// edit and the vote's settlement commit with it.
	DecideApproval(ctx context.Context, callID string, d ApprovalDecision) (a Approval, decided bool, err error)
	// Approval reads an approval and the event ID its card was
	// acknowledged as ("" before).
	Approval(ctx context.Context, callID string) (a Approval, cardEventID string, found bool, err error)
	// CardApproval finds the approval whose card was acknowledged as
	// cardEventID.
	CardApproval(ctx context.Context, cardEventID string) (Approval, bool, error)
	// ApprovalsForEvent lists the approvals of one event's turn, oldest
	// first.
	ApprovalsForEvent(ctx context.Context, eventID string) ([]Approval, error)
	// OpenApprovals lists a room's undecided approvals.
	OpenApprovals(ctx context.Context, roomID string) ([]Approval, error)
	// DueApprovals lists undecided approvals expiring by nowMS.
	DueApprovals(ctx context.Context, nowMS int64, limit int) ([]Approval, error)
	// DecidedAfter lists up to limit decisions after the one numbered
	// after, in the order they were written, with each one's number: a
	// cursor a reader follows to learn each decision once.
	DecidedAfter(ctx context.Context, after int64, limit int) ([]Approval, []int64, error)
	ToolRuns
}

// ToolRuns records the runs of approved calls an agent has the daemon run,
// so each runs at most once whatever crashes.
type ToolRuns interface {
	// StartToolRun claims the run of an approved call: started is true
	// when this call claimed it, and the run may go ahead; false when it
	// was claimed before, and a.Run says how far it got (a.RunResult its
	// result once finished). A call not approved is ErrNotApproved.
	StartToolRun(ctx context.Context, callID string) (a Approval, started bool, err error)
	// FinishToolRun records the result of a run StartToolRun claimed, at
	// most MaxToolResultBytes (ErrInvalidArgument beyond); recording it
	// again changes nothing.
	FinishToolRun(ctx context.Context, callID, result string) (Approval, error)
}

// Decided is a with the decision state made by who with event at nowMS.
func Decided(a Approval, state ApprovalState, who, event string, nowMS int64) Approval {
	a.State, a.DecidedBy, a.DecisionEventID, a.DecidedMS = state, who, event, nowMS
	return a
}
