package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"
)

// Bounds of the tools' arguments, the agent API's own.
const (
	maxLimit           = 1000
	defaultWaitSeconds = 30
	maxWaitSeconds     = 300
	maxApprovalSeconds = 7 * 24 * 60 * 60
)

// The tools' arguments. Their JSON schemas are inferred from these types:
// a field without omitempty is required, and the jsonschema tag is its
// description.

type listRoomsIn struct{}

type readConversationIn struct {
	RoomID string `json:"room_id" jsonschema:"the room's ID, !opaque:server"`
	Thread string `json:"thread,omitempty" jsonschema:"read this thread instead of the whole room: the event ID of its root ($opaque)"`
	Limit  int    `json:"limit,omitempty" jsonschema:"the most messages on the page, 1 to 1000 (default 50)"`
	Before string `json:"before,omitempty" jsonschema:"the next_cursor of the previous page, to read older messages; absent for the newest page"`
	Strict bool   `json:"strict,omitempty" jsonschema:"fail (strict_read_failed) rather than return a page with messages missing because the homeserver could not be asked"`
}

type waitForWorkIn struct {
	After       int64 `json:"after,omitempty" jsonschema:"return only work after this position: the next_after of the previous answer (default 0: all pending work)"`
	WaitSeconds *int  `json:"wait_seconds,omitempty" jsonschema:"with nothing pending, wait up to this many seconds for work to come, 0 to 300 (default 30)"`
	Limit       int   `json:"limit,omitempty" jsonschema:"the most events returned, 1 to 1000 (default 50)"`
}

type replyIn struct {
	EventID string `json:"event_id" jsonschema:"the pending event to answer ($opaque), from wait_for_work"`
	Body    string `json:"body" jsonschema:"the text of the answer"`
	Format  string `json:"format,omitempty" jsonschema:"markdown (default: rendered as HTML beside the text) or plain"`
	RoomID  string `json:"room_id,omitempty" jsonschema:"the event's room, checked: an event of another room is not_found"`
}

type sendIn struct {
	RoomID  string `json:"room_id" jsonschema:"the room to post in, !opaque:server"`
	Key     string `json:"key,omitempty" jsonschema:"required: an idempotency key you choose for this message, such as a UUID; a retry with the same key and content sends nothing twice, the same key with other content is a conflict"`
	Body    string `json:"body" jsonschema:"the text of the message"`
	Format  string `json:"format,omitempty" jsonschema:"markdown (default: rendered as HTML beside the text) or plain"`
	Thread  string `json:"thread,omitempty" jsonschema:"post inside this thread: the event ID of its root"`
	ReplyTo string `json:"reply_to,omitempty" jsonschema:"post as a reply to this event"`
}

type reactIn struct {
	EventID string `json:"event_id" jsonschema:"the event to react to ($opaque)"`
	Key     string `json:"key" jsonschema:"the reaction, usually one emoji such as 👍"`
}

type ignoreIn struct {
	EventID string `json:"event_id" jsonschema:"the pending event to settle without an answer ($opaque)"`
}

type leaveIn struct {
	RoomID string `json:"room_id" jsonschema:"the room to leave, !opaque:server"`
}

type requestApprovalIn struct {
	EventID    string          `json:"event_id" jsonschema:"the pending event whose work needs the call ($opaque), from wait_for_work"`
	CallID     string          `json:"call_id" jsonschema:"an ID you choose for this call, such as a UUID, 1 to 128 bytes: asking again with the same ID and call returns the recorded request; another call under the same ID is a conflict"`
	Tool       string          `json:"tool" jsonschema:"the name of the tool the call would run"`
	Arguments  json.RawMessage `json:"arguments" jsonschema:"the call's arguments as one JSON object, exactly as the call would run with them"`
	Approvers  []string        `json:"approvers,omitempty" jsonschema:"who may decide, Matrix user IDs (@name:server), at most 20 (default: the event's sender)"`
	ExpiresInS int64           `json:"expires_in_s,omitempty" jsonschema:"seconds until an undecided call expires, 1 to 604800 (default 3600)"`
	Secret     []string        `json:"secret,omitempty" jsonschema:"names of arguments never shown on the card, such as tokens"`
	Rendering  string          `json:"rendering,omitempty" jsonschema:"your own words for the call, shown on the card above it (at most 4 KiB)"`
	Context    json.RawMessage `json:"context,omitempty" jsonschema:"optional state of your own (any JSON value), kept with the request and returned with its decision, so you can resume from it after a restart"`
}

type waitForDecisionIn struct {
	EventID     string `json:"event_id" jsonschema:"the event the approval was asked for ($opaque)"`
	CallID      string `json:"call_id" jsonschema:"the call_id given to request_approval"`
	WaitSeconds *int   `json:"wait_seconds,omitempty" jsonschema:"while the approval is open, wait up to this many seconds for its decision, 0 to 300 (default 30)"`
}

// The tools' results, the agent API's answers as they are: these types
// only give the output schemas. Unknown fields are allowed, so a field the
// API adds later does not fail the tool.

type room struct {
	RoomID          string `json:"room_id" jsonschema:"the room's ID"`
	Name            string `json:"name" jsonschema:"the room's name; empty when it has none"`
	Topic           string `json:"topic,omitempty" jsonschema:"the room's topic, when it has one"`
	Encrypted       bool   `json:"encrypted" jsonschema:"whether the room is end-to-end encrypted"`
	Members         int    `json:"members" jsonschema:"how many members joined it"`
	Epoch           int64  `json:"epoch" jsonschema:"the agent's membership epoch of the room: it moves on each time the agent leaves"`
	NewestMessageTS int64  `json:"newest_message_ts" jsonschema:"when the newest message of the room's main timeline came, in milliseconds since 1970; 0 when none is journaled"`
	Pending         int64  `json:"pending" jsonschema:"how many of the room's events are still owed an answer"`
}

type roomsOut struct {
	Rooms []room `json:"rooms" jsonschema:"the rooms the agent is in"`
}

type message struct {
	EventID   string          `json:"event_id" jsonschema:"the message's event ID (the original's, also for an edited message)"`
	Sender    string          `json:"sender" jsonschema:"who sent it"`
	CreatedTS int64           `json:"created_ts" jsonschema:"when, in milliseconds since 1970"`
	Content   json.RawMessage `json:"content" jsonschema:"the visible revision's Matrix content; its text is in body"`
}

type messagesOut struct {
	Messages    []message `json:"messages" jsonschema:"the page, oldest message first"`
	NextCursor  *string   `json:"next_cursor" jsonschema:"pass as before to read older messages; null at the start of the conversation"`
	OwedRefetch []string  `json:"owed_refetch" jsonschema:"messages left off the page until the homeserver is asked again"`
}

type pendingEvent struct {
	Position int64           `json:"position" jsonschema:"the event's place in the agent's receipt order"`
	EventID  string          `json:"event_id" jsonschema:"the event to reply to or ignore"`
	RoomID   string          `json:"room_id" jsonschema:"its room"`
	ThreadID *string         `json:"thread_id" jsonschema:"the root of its thread, or null"`
	Sender   string          `json:"sender" jsonschema:"who sent it"`
	Content  json.RawMessage `json:"content" jsonschema:"its Matrix content; its text is in body"`
}

type pendingOut struct {
	Events    []pendingEvent `json:"events" jsonschema:"pending events in receipt order"`
	NextAfter int64          `json:"next_after" jsonschema:"pass as after next time"`
	TimedOut  bool           `json:"timed_out" jsonschema:"true when the whole wait passed and nothing came"`
}

type deliveryOut struct {
	DeliveryID string `json:"delivery_id" jsonschema:"the outbox row that sends it"`
	TxnID      string `json:"txn_id" jsonschema:"the Matrix transaction ID, the same on every retry"`
	Outcome    string `json:"outcome" jsonschema:"created, or replayed when the same request was already taken (nothing new is sent)"`
	State      string `json:"state,omitempty" jsonschema:"where the delivery is: queued, attempted, acknowledged, failed or retired"`
	EventID    string `json:"event_id,omitempty" jsonschema:"the event ID the homeserver gave the message, once acknowledged"`
}

type approvalOut struct {
	CallID         string   `json:"call_id"`
	EventID        string   `json:"event_id"`
	State          string   `json:"state" jsonschema:"open until decided: approved, denied, expired or withdrawn"`
	Outcome        string   `json:"outcome" jsonschema:"created (the card is queued), or replayed when the same call was asked for before (nothing new is sent)"`
	CardDeliveryID string   `json:"card_delivery_id" jsonschema:"the outbox row that sends the card"`
	Approvers      []string `json:"approvers" jsonschema:"who may decide"`
	ExpiresAtMS    int64    `json:"expires_at_ms" jsonschema:"when an undecided call expires, in milliseconds since 1970"`
}

type decisionOut struct {
	CallID          string          `json:"call_id"`
	EventID         string          `json:"event_id"`
	RoomID          string          `json:"room_id"`
	Tool            string          `json:"tool"`
	Arguments       json.RawMessage `json:"arguments" jsonschema:"the call's arguments as recorded: the call to run if approved"`
	Secret          []string        `json:"secret"`
	Approvers       []string        `json:"approvers"`
	State           string          `json:"state" jsonschema:"open, approved, denied, expired (nobody decided in time) or withdrawn (the agent left the room); run the call only when approved"`
	DecidedBy       string          `json:"decided_by" jsonschema:"the approver who decided; empty while open, and for an expiry or a withdrawal"`
	DecisionEventID string          `json:"decision_event_id" jsonschema:"the reaction or reply that decided"`
	DecidedAtMS     int64           `json:"decided_at_ms" jsonschema:"when it was decided, in milliseconds since 1970; 0 while open"`
	Reason          string          `json:"reason" jsonschema:"why it expired or was withdrawn"`
	CardEventID     string          `json:"card_event_id" jsonschema:"the card's event ID once sent"`
	CreatedAtMS     int64           `json:"created_at_ms"`
	ExpiresAtMS     int64           `json:"expires_at_ms"`
	TimedOut        bool            `json:"timed_out" jsonschema:"true when the wait ended with the approval still open: call again to keep waiting"`
}

type ignoreOut struct {
	EventID string `json:"event_id"`
	Settled bool   `json:"settled"`
}

type leaveOut struct {
	RoomID string `json:"room_id"`
	Left   bool   `json:"left"`
}

// schemaFor infers T's schema. A json.RawMessage is a JSON object (Matrix
// content), not the byte array reflection would make of it.
func schemaFor[T any](output bool) *jsonschema.Schema {
	s, err := jsonschema.For[T](&jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[json.RawMessage](): {Type: "object"},
	}})
	if err != nil {
		panic(fmt.Sprintf("schema of %T: %v", *new(T), err))
	}
	if output {
		openObjects(s)
	}
	return s
}

// openObjects lets every object of an output schema hold properties it
// does not list.
func openObjects(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	s.AdditionalProperties = nil
	for _, p := range s.Properties {
		openObjects(p)
	}
	openObjects(s.Items)
}

// bound sets a numeric property's range.
func bound(s *jsonschema.Schema, prop string, lo, hi float64) {
	p := s.Properties[prop]
	p.Minimum, p.Maximum = &lo, &hi
}

// formats are the values of a format argument.
var formats = []any{"markdown", "plain"}

// The tools' schemas, built once: every server shares them, and the SDK's
// cache resolves each once.
var (
	readConversationSchema = func() *jsonschema.Schema {
		s := schemaFor[readConversationIn](false)
		bound(s, "limit", 1, maxLimit)
		return s
	}()
	waitForWorkSchema = func() *jsonschema.Schema {
		s := schemaFor[waitForWorkIn](false)
		bound(s, "limit", 1, maxLimit)
		bound(s, "wait_seconds", 0, maxWaitSeconds)
		s.Properties["after"].Minimum = new(float64)
		s.Properties["wait_seconds"].Default = json.RawMessage(fmt.Sprint(defaultWaitSeconds))
		return s
	}()
	replySchema = func() *jsonschema.Schema {
		s := schemaFor[replyIn](false)
		s.Properties["format"].Enum = formats
		return s
	}()
	requestApprovalSchema = func() *jsonschema.Schema {
		s := schemaFor[requestApprovalIn](false)
		bound(s, "expires_in_s", 1, maxApprovalSeconds)
		return s
	}()
	waitForDecisionSchema = func() *jsonschema.Schema {
		s := schemaFor[waitForDecisionIn](false)
		bound(s, "wait_seconds", 0, maxWaitSeconds)
		s.Properties["wait_seconds"].Default = json.RawMessage(fmt.Sprint(defaultWaitSeconds))
		return s
	}()
	sendSchema = func() *jsonschema.Schema {
		s := schemaFor[sendIn](false)
		s.Properties["format"].Enum = formats
		return s
	}()
)

// Annotation values.
var (
	yes = new(true)
	no  = new(false)
)

// addTools adds the agent's tools to srv, each one call through c.
func addTools(srv *mcp.Server, c *client, log zerolog.Logger) {
	t := tools{c: c, log: log}
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "list_rooms",
		Title: "List rooms",
		Description: "Lists the rooms the agent is joined to: each room's ID, name, topic, whether it is encrypted, " +
			"how many members it has, when its newest message came and how much of its work is pending. The " +
			"homeserver is asked for the rooms' state.",
		InputSchema:  schemaFor[listRoomsIn](false),
		OutputSchema: schemaFor[roomsOut](true),
		// Open world: the homeserver is asked, and room names are other
		// people's text.
		Annotations: &mcp.ToolAnnotations{Title: "List rooms", ReadOnlyHint: true, OpenWorldHint: yes},
	}, t.listRooms)
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "read_conversation",
		Title: "Read a conversation",
		Description: "Reads one page of a room's conversation, or of a thread in it, as people see it: one message per " +
			"logical message at its latest edit, redacted text gone, oldest first within the page. The first page is " +
			"the newest; pass its next_cursor as before for older ones.",
		InputSchema:  readConversationSchema,
		OutputSchema: schemaFor[messagesOut](true),
		// Open world: the messages are other people's, and a conversation
		// the journal lacks is fetched from the homeserver.
		Annotations: &mcp.ToolAnnotations{Title: "Read a conversation", ReadOnlyHint: true, OpenWorldHint: yes},
	}, t.readConversation)
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "wait_for_work",
		Title: "Wait for work",
		Description: "Returns the agent's pending work in receipt order (messages, reactions and other events it owes " +
			"an answer), waiting up to wait_seconds when there is none. Pass the answer's next_after as after on the " +
			"next call. Work stays pending until you reply to it or ignore it, so an agent that stops midway gets it " +
			"again (after=0 returns everything still pending).",
		InputSchema:  waitForWorkSchema,
		OutputSchema: schemaFor[pendingOut](true),
		// Reading does not settle anything: only reply and ignore do.
		Annotations: &mcp.ToolAnnotations{Title: "Wait for work", ReadOnlyHint: true, OpenWorldHint: yes},
	}, t.waitForWork)
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "reply",
		Title: "Reply to an event",
		Description: "Answers a pending event in its room (inside its thread when it has one, as a reply to it) and " +
			"settles it. Idempotent by event ID: the same answer again returns outcome replayed and sends nothing; " +
			"a different answer to an answered event is a conflict.",
		InputSchema:  replySchema,
		OutputSchema: schemaFor[deliveryOut](true),
		Annotations: &mcp.ToolAnnotations{Title: "Reply to an event", DestructiveHint: no, IdempotentHint: true,
			OpenWorldHint: yes},
	}, t.reply)
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "send",
		Title: "Send a message",
		Description: "Posts a new message into a room the agent is in, not as an answer to pending work: optionally " +
			"inside a thread or as a reply to an event. key is required: the message is sent once per key and room, " +
			"so retry with the same key; the same key with another message is a conflict, and so is a room the " +
			"agent is not in. Sending settles no pending work: use reply for that.",
		InputSchema:  sendSchema,
		OutputSchema: schemaFor[deliveryOut](true),
		Annotations: &mcp.ToolAnnotations{Title: "Send a message", DestructiveHint: no, IdempotentHint: true,
			OpenWorldHint: yes},
	}, t.send)
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "react",
		Title: "React to an event",
		Description: "Puts a reaction (an emoji, or a short text) on an event the agent has seen, in a room it is " +
			"in. The same reaction on the same event is sent once: asking again returns outcome replayed. Reacting " +
			"settles no pending work.",
		InputSchema:  schemaFor[reactIn](false),
		OutputSchema: schemaFor[deliveryOut](true),
		Annotations: &mcp.ToolAnnotations{Title: "React to an event", DestructiveHint: no, IdempotentHint: true,
			OpenWorldHint: yes},
	}, t.react)
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "ignore",
		Title: "Ignore an event",
		Description: "Settles a pending event without answering it, so wait_for_work no longer returns it. A " +
			"placeholder queued for it and not yet sent is withdrawn. An event no longer pending is not_found.",
		InputSchema:  schemaFor[ignoreIn](false),
		OutputSchema: schemaFor[ignoreOut](true),
		// Closed world: it only marks the event in the agent's journal.
		Annotations: &mcp.ToolAnnotations{Title: "Ignore an event", DestructiveHint: no, IdempotentHint: true,
			OpenWorldHint: no},
	}, t.ignore)
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "leave",
		Title: "Leave a room",
		Description: "Has the agent leave a room. Nothing from the room is answered, shown or sent afterwards, and " +
			"the agent cannot come back unless invited again.",
		InputSchema:  schemaFor[leaveIn](false),
		OutputSchema: schemaFor[leaveOut](true),
		Annotations: &mcp.ToolAnnotations{Title: "Leave a room", DestructiveHint: yes, IdempotentHint: true,
			OpenWorldHint: yes},
	}, t.leave)
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "request_approval",
		Title: "Ask for approval of a tool call",
		Description: "Asks a person to approve one exact call (a tool and its arguments) before you run it: a card " +
			"goes into the event's thread saying the tool, its arguments (the secret ones hidden), who may decide and " +
			"until when; an approver decides by reacting to the card or replying approve or deny. Then call " +
			"wait_for_decision, and run the call only if it is approved, with exactly these arguments. Idempotent by " +
			"call_id: the same call again returns the recorded request (outcome replayed) and sends nothing; another " +
			"call under the same call_id is a conflict, and so is an event no longer pending. Numbers in arguments " +
			"pass as 64-bit floats: send an integer past 2^53 as a string.",
		InputSchema:  requestApprovalSchema,
		OutputSchema: schemaFor[approvalOut](true),
		Annotations: &mcp.ToolAnnotations{Title: "Ask for approval of a tool call", DestructiveHint: no,
			IdempotentHint: true, OpenWorldHint: yes},
	}, t.requestApproval)
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "wait_for_decision",
		Title: "Wait for an approval's decision",
		Description: "Reads an approval asked for with request_approval, waiting up to wait_seconds for its decision " +
			"while it is open. state is open, approved, denied, expired or withdrawn; a decision never changes. " +
			"timed_out is true when the wait ended with it still open: call again to keep waiting. Run the call only " +
			"when the state is approved.",
		InputSchema:  waitForDecisionSchema,
		OutputSchema: schemaFor[decisionOut](true),
		// Open world: people decide.
		Annotations: &mcp.ToolAnnotations{Title: "Wait for an approval's decision", ReadOnlyHint: true, OpenWorldHint: yes},
	}, t.waitForDecision)
}

// tools are the tool handlers of one agent.
type tools struct {
	c   *client
	log zerolog.Logger
}

// result is a tool's answer: the API's JSON as the structured content (the
// SDK adds it as text too), or the API's refusal as a tool error. A call
// that got no answer is logged too: the client sees the error, but the
// operator must learn the API is out of reach.
func (t tools) result(req *mcp.CallToolRequest) func(json.RawMessage, *apiError) (*mcp.CallToolResult, any, error) {
	return func(out json.RawMessage, err *apiError) (*mcp.CallToolResult, any, error) {
		if err != nil {
			if err.Status == 0 && err.Code != "cancelled" {
				t.log.Warn().Str("tool", req.Params.Name).Str("code", err.Code).Str("error", err.Message).
					Msg("A tool's API call got no answer")
			}
			return toolError(err), nil, nil
		}
		return nil, out, nil
	}
}

// toolError is a tool error whose text starts with the API's code and
// whose structured content is {"code","message","status"}.
func toolError(e *apiError) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: e.Error()}}, StructuredContent: *e}
}

func (t tools) listRooms(ctx context.Context, req *mcp.CallToolRequest, _ listRoomsIn) (*mcp.CallToolResult, any, error) {
	return t.result(req)(t.c.rooms(callerContext(ctx, req.Extra)))
}

func (t tools) readConversation(ctx context.Context, req *mcp.CallToolRequest, in readConversationIn) (*mcp.CallToolResult, any, error) {
	return t.result(req)(t.c.messages(callerContext(ctx, req.Extra), messagesQuery{room: in.RoomID, thread: in.Thread,
		before: in.Before, limit: in.Limit, strict: in.Strict}))
}

func (t tools) waitForWork(ctx context.Context, req *mcp.CallToolRequest, in waitForWorkIn) (*mcp.CallToolResult, any, error) {
	wait := defaultWaitSeconds
	if in.WaitSeconds != nil {
		wait = *in.WaitSeconds
	}
	return t.result(req)(t.c.pending(callerContext(ctx, req.Extra), in.After, time.Duration(wait)*time.Second, in.Limit))
}

func (t tools) reply(ctx context.Context, req *mcp.CallToolRequest, in replyIn) (*mcp.CallToolResult, any, error) {
	return t.result(req)(t.c.reply(callerContext(ctx, req.Extra), in.EventID, replyBody{Body: in.Body, Format: in.Format, RoomID: in.RoomID}))
}

func (t tools) send(ctx context.Context, req *mcp.CallToolRequest, in sendIn) (*mcp.CallToolResult, any, error) {
	if in.Key == "" {
		// Without a key a retry would send the message twice; the API
		// would refuse it too, but nothing needs asking to know that.
		return toolError(badRequest("key is required: an idempotency key you choose for this message, the same on a retry")), nil, nil
	}
	return t.result(req)(t.c.send(callerContext(ctx, req.Extra), in.RoomID, in.Key,
		sendBody{Body: in.Body, Format: in.Format, Thread: in.Thread, ReplyTo: in.ReplyTo}))
}

func (t tools) react(ctx context.Context, req *mcp.CallToolRequest, in reactIn) (*mcp.CallToolResult, any, error) {
	return t.result(req)(t.c.react(callerContext(ctx, req.Extra), in.EventID, in.Key))
}

func (t tools) ignore(ctx context.Context, req *mcp.CallToolRequest, in ignoreIn) (*mcp.CallToolResult, any, error) {
	return t.result(req)(t.c.ignore(callerContext(ctx, req.Extra), in.EventID))
}

func (t tools) leave(ctx context.Context, req *mcp.CallToolRequest, in leaveIn) (*mcp.CallToolResult, any, error) {
	return t.result(req)(t.c.leave(callerContext(ctx, req.Extra), in.RoomID))
}

func (t tools) requestApproval(ctx context.Context, req *mcp.CallToolRequest, in requestApprovalIn) (*mcp.CallToolResult, any, error) {
	return t.result(req)(t.c.requestApproval(callerContext(ctx, req.Extra), in.EventID, approvalBody{CallID: in.CallID,
		Tool: in.Tool, Arguments: in.Arguments, Approvers: in.Approvers, ExpiresInS: in.ExpiresInS, Secret: in.Secret,
		Rendering: in.Rendering, Context: in.Context}))
}

func (t tools) waitForDecision(ctx context.Context, req *mcp.CallToolRequest, in waitForDecisionIn) (*mcp.CallToolResult, any, error) {
	wait := defaultWaitSeconds
	if in.WaitSeconds != nil {
		wait = *in.WaitSeconds
	}
	return t.result(req)(t.c.approval(callerContext(ctx, req.Extra), in.EventID, in.CallID, time.Duration(wait)*time.Second))
}
