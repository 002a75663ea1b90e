// Package modelstub is a small OpenAI-compatible chat completions server
// on a loopback port, for the tests and the demo of the openai back-end:
// it records every request and answers each as its Answer function says,
// streamed as server-sent events (data: {chunk}, then data: [DONE]) the way
// llama.cpp, Ollama and OpenAI do, or whole, or not at all (a refusal, a
// stream cut short).
package modelstub

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Request is what the server was asked.
type Request struct {
	Model    string
	Stream   bool
	Messages []Message
	// Tools names the functions the request offers, in order.
	Tools []string
	// ToolChoice is the request's tool_choice when it is a word ("none",
	// "auto"), "" when absent.
	ToolChoice string
	// Authorization is the request's Authorization header.
	Authorization string
}

// Message is one message of a request.
type Message struct {
	Role    string
	Content string
	// ToolCalls are an assistant message's calls.
	ToolCalls []ToolCall
	// ToolCallID is the call a tool message answers.
	ToolCallID string
}

// ToolCall is one function call of the model.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string
}

// Question is the content of the request's last message, the one the
// model is asked to answer.
func (r Request) Question() string {
	if len(r.Messages) == 0 {
		return ""
	}
	return r.Messages[len(r.Messages)-1].Content
}

// Reply says how the server answers one request.
type Reply struct {
	// Status, unless zero or 200, refuses the request with this status and
	// an OpenAI-style error whose message is Text.
	Status int
	// Text is the answer. A stream sends it a word (and its following
	// space) a chunk, then a chunk with finish_reason "stop", then [DONE].
	Text string
	// ToolCalls, when set, are calls the answer makes (after Text, if any),
	// its finish reason "tool_calls". A stream sends each in two chunks,
	// its arguments split between them.
	ToolCalls []ToolCall
	// Delay comes before each chunk of a stream.
	Delay time.Duration
	// CutAfter, when positive, ends a stream after that many chunks of
	// text, with neither a finish reason nor [DONE]: the response ends
	// cleanly, as when a server gives up. Abort tears the connection down
	// instead.
	CutAfter int
	Abort    bool
	// OnChunk, when set, is called after each chunk of text is flushed,
	// with the request's context (done once the client went away) and the
	// chunk's number from 1: a test blocks in it to hold a stream open.
	OnChunk func(ctx context.Context, n int)
}

// Server is a running stub.
type Server struct {
	// URL is the API's base URL, http://127.0.0.1:PORT/v1.
	URL string

	answer   func(Request) Reply
	srv      *http.Server
	mu       sync.Mutex
	requests []Request
}

// Start serves on a free loopback port until Close; answer decides each
// reply, in the order requests arrive.
func Start(answer func(Request) Reply) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("model stub: %w", err)
	}
	s := &Server{URL: "http://" + l.Addr().String() + "/v1", answer: answer}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.complete)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

// Close stops the server, ending any stream still open.
func (s *Server) Close() error { return s.srv.Close() }

// Requests returns every request so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Asked counts the requests whose question is q.
func (s *Server) Asked(q string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Question() == q {
			n++
		}
	}
	return n
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role       string          `json:"role"`
			Content    json.RawMessage `json:"content"`
			ToolCallID string          `json:"tool_call_id"`
			ToolCalls  []wireToolCall  `json:"tool_calls"`
		} `json:"messages"`
		Tools []struct {
			Type     string `json:"type"`
			Function struct {
				Name       string         `json:"name"`
				Parameters map[string]any `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
		ToolChoice json.RawMessage `json:"tool_choice"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		refuse(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
		return
	}
	req := Request{Model: body.Model, Stream: body.Stream, Authorization: r.Header.Get("Authorization")}
	for _, t := range body.Tools {
		if t.Type != "function" || t.Function.Name == "" || t.Function.Parameters == nil {
			refuse(w, http.StatusBadRequest, "a tool must be a function with a name and parameters")
			return
		}
		req.Tools = append(req.Tools, t.Function.Name)
	}
	_ = json.Unmarshal(body.ToolChoice, &req.ToolChoice)
	for _, m := range body.Messages {
		msg := Message{Role: m.Role, ToolCallID: m.ToolCallID}
		// Only an assistant's message that calls tools may go without
		// content, as the API has it.
		if (len(m.ToolCalls) == 0 || len(m.Content) > 0) && json.Unmarshal(m.Content, &msg.Content) != nil {
			refuse(w, http.StatusBadRequest, "message content is not a string")
			return
		}
		if m.Role == "tool" && m.ToolCallID == "" {
			refuse(w, http.StatusBadRequest, "a tool message needs its tool_call_id")
			return
		}
		for _, c := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
		req.Messages = append(req.Messages, msg)
	}
	s.mu.Lock()
	s.requests = append(s.requests, req)
	s.mu.Unlock()

	reply := s.answer(req)
	switch {
	case reply.Status != 0 && reply.Status != http.StatusOK:
		refuse(w, reply.Status, reply.Text)
	case req.Stream:
		stream(w, r, req.Model, reply)
	default:
		w.Header().Set("Content-Type", "application/json")
		message := map[string]any{"role": "assistant", "content": reply.Text}
		finish := "stop"
		if len(reply.ToolCalls) > 0 {
			calls := make([]wireToolCall, len(reply.ToolCalls))
			for i, c := range reply.ToolCalls {
				calls[i] = wire(c)
			}
			message["tool_calls"], finish = calls, "tool_calls"
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-stub", "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "message": message}},
		})
	}
}

// refuse answers with status and an error in OpenAI's shape.
func refuse(w http.ResponseWriter, status int, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": message, "type": "stub_error"}})
}

// stream sends reply as server-sent events.
func stream(w http.ResponseWriter, r *http.Request, model string, reply Reply) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(delta map[string]any, finish any) error {
		chunk, err := json.Marshal(map[string]any{
			"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}},
		})
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	for i, word := range words(reply.Text) {
		if reply.Delay > 0 {
			select {
			case <-time.After(reply.Delay):
			case <-r.Context().Done():
				return
			}
		}
		delta := map[string]any{"content": word}
		if i == 0 {
			delta["role"] = "assistant"
		}
		if send(delta, nil) != nil {
			return
		}
		if reply.OnChunk != nil {
			if reply.OnChunk(r.Context(), i+1); r.Context().Err() != nil {
				return
			}
		}
		if reply.CutAfter > 0 && i+1 >= reply.CutAfter {
			if reply.Abort {
				// The server's way to abandon a response: the connection
				// closes, and the client reads a body cut in the middle.
				panic(http.ErrAbortHandler)
			}
			return
		}
	}
	for i, c := range reply.ToolCalls {
		half := len(c.Arguments) / 2
		first := wire(ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments[:half]})
		if send(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": first.ID, "type": "function",
			"function": first.Function}}}, nil) != nil {
			return
		}
		if send(map[string]any{"tool_calls": []any{map[string]any{"index": i,
			"function": map[string]string{"arguments": c.Arguments[half:]}}}}, nil) != nil {
			return
		}
	}
	finish := "stop"
	if len(reply.ToolCalls) > 0 {
		finish = "tool_calls"
	}
	if send(map[string]any{}, finish) != nil {
		return
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
}

// words splits text into chunks of one word and the spaces after it.
func words(text string) []string {
	var out []string
	for text != "" {
		i := strings.IndexByte(text, ' ')
		if i < 0 {
			out = append(out, text)
			break
		}
		j := i
		for j < len(text) && text[j] == ' ' {
			j++
		}
		out = append(out, text[:j])
		text = text[j:]
	}
	return out
}

// wireToolCall is a tool call as the API writes it.
type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func wire(c ToolCall) wireToolCall {
	w := wireToolCall{ID: c.ID, Type: "function"}
	w.Function.Name, w.Function.Arguments = c.Name, c.Arguments
	return w
}
