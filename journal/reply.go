package journal

import (
	"encoding/json"
	"errors"
	"fmt"
)

// The reply rule: how an answer is related to the event it answers and
// which enqueue requests carry it. The principal's own turns and the agent
// API both answer through it, so an answer made in either place is the
// same bytes and the same delivery.

// RelateReply returns content as the answer to source: in source's thread
// when thread is not nil (a genuine reply within it, so is_falling_back is
// false: the relation is no fallback for clients without threads), as a
// reply to source otherwise. Content that already names a relation keeps
// it. The result depends on its arguments alone: a replayed answer is
// recognised by comparing it with the recorded one.
func RelateReply(content []byte, source string, thread *string) ([]byte, error) {
	v, err := decodeJSON(content)
	c, ok := v.(map[string]any)
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: agent reply content must be a JSON object", ErrInvalidArgument)
	}
	if _, ok := c["m.relates_to"]; !ok {
		reply := map[string]any{"event_id": source}
		if thread != nil {
			c["m.relates_to"] = map[string]any{"rel_type": "m.thread", "event_id": *thread,
				"is_falling_back": false, "m.in_reply_to": reply}
		} else {
			c["m.relates_to"] = map[string]any{"m.in_reply_to": reply}
		}
	}
	return json.Marshal(c)
}

// FinalReply is the enqueue request of the answer to source, an event of
// roomID in thread, with content already related (RelateReply). It settles
// source; with record set it also writes the answer's turn record, which a
// retry of an answer already recorded leaves out.
func FinalReply(roomID, source string, thread *string, content []byte, record bool) EnqueueRequest {
	id := ReplyDeliveryID(source)
	req := EnqueueRequest{DeliveryID: id, Stage: StageFinal, RoomID: roomID, Thread: thread,
		TurnID: id, Content: content, Sources: []string{source}}
	if record {
		req.Turn = &TurnRecord{TurnID: id, RoomID: roomID, State: TurnResultRecorded,
			Sources: []string{source}, Record: content}
	}
	return req
}

// PlaceholderReply is the enqueue request of the placeholder shown while
// the answer to source is made. It has no sources, so source stays pending
// until its answer; enqueued again, it is the same row.
func PlaceholderReply(roomID, source string, thread *string, content []byte) EnqueueRequest {
	return EnqueueRequest{DeliveryID: ReplyDeliveryID(source), Stage: StageInitial, RoomID: roomID,
		Thread: thread, Content: content}
}

// DropsTurn reports whether err, returned by an enqueue of a reply, means
// nothing may answer the event any more: the membership it came under has
// ended, or its delivery was retired with it. The event is then settled
// unanswered.
func DropsTurn(err error) bool {
	return errors.Is(err, ErrMembershipEnded) || errors.Is(err, ErrDeliveryRetired)
}
