package agent

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

// Echo answers each text message with "echo: " and its body, and ignores
// every other kind of event: the demo's agent, and the simplest proof that a
// daemon answers.
type Echo struct{}

var _ Agent = Echo{}

// Answer implements Agent.
func (Echo) Answer(_ context.Context, turn Turn) (Reply, error) {
	if turn.Event.Kind != journal.KindMessage {
		return Reply{Ignore: true}, nil
	}
	body, err := Body(turn.Event.Event)
	if err != nil {
		return Reply{}, fmt.Errorf("echo: %w", err)
	}
	reply, err := json.Marshal(map[string]string{"msgtype": "m.text", "body": "echo: " + body})
	return Reply{Content: reply}, err
}

// Body reads content.body of an event's canonical JSON, by its exact keys
// as every rule does (a struct decode would also take "CONTENT").
func Body(event json.RawMessage) (string, error) {
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(event, &ev); err != nil {
		return "", err
	}
	var content map[string]json.RawMessage
	if err := json.Unmarshal(ev["content"], &content); err != nil {
		return "", fmt.Errorf("content: %w", err)
	}
	var body string
	if raw, ok := content["body"]; ok {
		if err := json.Unmarshal(raw, &body); err != nil {
			return "", fmt.Errorf("content.body: %w", err)
		}
	}
	return body, nil
}
