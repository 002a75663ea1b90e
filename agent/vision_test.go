package agent_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix/crypto/attachment"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// visionModel is a chat completions server that keeps each request's
// messages as sent (modelstub reads string contents only) and answers
// "A cat." to every one.
type visionModel struct {
	URL      string
	mu       sync.Mutex
	requests [][]visionMessage
}

// visionMessage is one message of a request: its content a string, or
// parts.
type visionMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// visionPart is one content part.
type visionPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

func startVisionModel(t *testing.T) *visionModel {
	t.Helper()
	m := &visionModel{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages []visionMessage `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m.mu.Lock()
		m.requests = append(m.requests, body.Messages)
		m.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,`+
			`"finish_reason":"stop","message":{"role":"assistant","content":"A cat."}}]}`)
	}))
	t.Cleanup(srv.Close)
	m.URL = srv.URL + "/v1"
	return m
}

func (m *visionModel) asked() [][]visionMessage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]visionMessage(nil), m.requests...)
}

// parts reads a message's content as parts; a string content is one text
// part.
func parts(t *testing.T, m visionMessage) []visionPart {
	t.Helper()
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []visionPart{{Type: "text", Text: s}}
	}
	var ps []visionPart
	if err := json.Unmarshal(m.Content, &ps); err != nil {
		t.Fatalf("message content %s: %v", m.Content, err)
	}
	return ps
}

// describe is a request's messages on one line each: role, then each
// part as its text or "image <url>".
func describe(t *testing.T, msgs []visionMessage) []string {
	t.Helper()
	var out []string
	for _, m := range msgs {
		line := m.Role + ":"
		for _, p := range parts(t, m) {
			switch {
			case p.Type == "text":
				line += " " + p.Text
			case p.Type == "image_url" && p.ImageURL != nil:
				line += " image " + p.ImageURL.URL
			default:
				line += " ?" + p.Type
			}
		}
		out = append(out, line)
	}
	return out
}

// pngBytes is a PNG as http.DetectContentType knows one: its signature,
// then anything.
var pngBytes = append([]byte("\x89PNG\r\n\x1a\n"), "the rest of a small picture"...)

func dataURL(mime string, data []byte) string {
	return "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(data)
}

// media is a FetchMedia that serves files by mxc URL and records what it
// was asked.
type media struct {
	mu    sync.Mutex
	files map[string][]byte
	asked []string
	max   []int64
}

func (m *media) fetch(_ context.Context, url string, max int64) ([]byte, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.asked, m.max = append(m.asked, url), append(m.max, max)
	data, ok := m.files[url]
	if !ok {
		return nil, "", errors.New("M_NOT_FOUND")
	}
	if int64(len(data)) > max {
		return nil, "", errors.New("media larger than the cap")
	}
	return append([]byte(nil), data...), "image/png", nil
}

// captioned is an image message whose body is a caption.
func captioned(id string, ts int64, caption, url string) mx.Ev {
	return mx.Image(id, alice, ts).With("content", map[string]any{
		"msgtype": "m.image", "body": caption, "filename": "cat.png", "url": url,
		"info": map[string]any{"mimetype": "image/png", "size": len(pngBytes)}})
}

func visionAgent(t *testing.T, model *visionModel, vision bool, m *media) *agent.OpenAI {
	t.Helper()
	o := agent.OpenAIOptions{BaseURL: model.URL, Model: "m", UserID: bot, Vision: vision, Log: zerolog.Nop()}
	if m != nil {
		o.FetchMedia = m.fetch
	}
	return agent.NewOpenAI(o)
}

func TestOpenAIWithVisionSendsTheEventsImageAsADataURLBesideItsCaption(t *testing.T) {
	model := startVisionModel(t)
	m := &media{files: map[string][]byte{"mxc://example.org/cat": pngBytes}}
	turn := execTurn(t, "$img",
		mx.Message("$hi", alice, 1000, "look at this"),
		captioned("$img", 2000, "what animal is this?", "mxc://example.org/cat"))
	reply, err := visionAgent(t, model, true, m).Answer(context.Background(), turn)
	if err != nil || reply.Ignore {
		t.Fatalf("reply = %+v, %v; want an answer to the image", reply, err)
	}
	if _, body, _ := replyBody(t, reply); body != "A cat." {
		t.Fatalf("reply body %q, want the model's answer", body)
	}
	reqs := model.asked()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	want := []string{"user: look at this", "user: what animal is this? image " + dataURL("image/png", pngBytes)}
	if got := describe(t, reqs[0]); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("messages =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(m.asked) != 1 || m.asked[0] != "mxc://example.org/cat" || m.max[0] != agent.DefaultMaxImageBytes {
		t.Fatalf("fetched %v with caps %v, want mxc://example.org/cat once, capped at %d", m.asked, m.max, agent.DefaultMaxImageBytes)
	}
}

func TestOpenAIWithoutVisionSendsNoImageAndLeavesAnImageUnanswered(t *testing.T) {
	model := startVisionModel(t)
	m := &media{files: map[string][]byte{"mxc://example.org/cat": pngBytes}}
	// The image itself is the event: settled unanswered, nothing asked.
	turn := execTurn(t, "$img", captioned("$img", 1000, "what animal is this?", "mxc://example.org/cat"))
	if reply, err := visionAgent(t, model, false, m).Answer(context.Background(), turn); err != nil || !reply.Ignore {
		t.Fatalf("reply = %+v, %v; want the image ignored", reply, err)
	}
	// A question after an image: text alone, every content a string.
	turn = execTurn(t, "$q", captioned("$img", 1000, "what animal is this?", "mxc://example.org/cat"),
		mx.Message("$q", alice, 2000, "and now?"))
	if _, err := visionAgent(t, model, false, m).Answer(context.Background(), turn); err != nil {
		t.Fatal(err)
	}
	reqs := model.asked()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1: the image alone asks nothing", len(reqs))
	}
	for _, msg := range reqs[0] {
		var s string
		if json.Unmarshal(msg.Content, &s) != nil {
			t.Fatalf("a message's content is %s, want text only without vision", msg.Content)
		}
	}
	if got := describe(t, reqs[0]); strings.Join(got, "\n") != "user: and now?" {
		t.Fatalf("messages = %q, want the question alone", got)
	}
	if len(m.asked) != 0 {
		t.Fatalf("media fetched without vision: %v", m.asked)
	}
}

// An image that cannot be had is not a failed turn: the model is told
// there was one it cannot see.
func TestOpenAIShowsAnImageItCannotHaveAsNotAvailable(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string][]byte
		max   int64
	}{
		{"FetchFails", map[string][]byte{}, 0},
		{"TooLarge", map[string][]byte{"mxc://example.org/cat": pngBytes}, int64(len(pngBytes) - 1)},
		{"NotAnImageModelsRead", map[string][]byte{"mxc://example.org/cat": []byte("<svg xmlns='http://www.w3.org/2000/svg'/>")}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			model := startVisionModel(t)
			m := &media{files: c.files}
			turn := execTurn(t, "$img", captioned("$img", 1000, "what animal is this?", "mxc://example.org/cat"))
			a := agent.NewOpenAI(agent.OpenAIOptions{BaseURL: model.URL, Model: "m", UserID: bot, Vision: true,
				FetchMedia: m.fetch, MaxImageBytes: c.max, Log: zerolog.Nop()})
			if reply, err := a.Answer(context.Background(), turn); err != nil || reply.Ignore {
				t.Fatalf("reply = %+v, %v; want an answer", reply, err)
			}
			want := "user: what animal is this?\n[image not available]"
			if got := describe(t, model.asked()[0]); strings.Join(got, "\n") != want {
				t.Fatalf("messages = %q, want %q", got, want)
			}
		})
	}
}

// An encrypted room's image is ciphertext on the homeserver: the model is
// sent the plaintext, decrypted with the key its message carries.
func TestOpenAIDecryptsAnEncryptedRoomsImage(t *testing.T) {
	model := startVisionModel(t)
	file := attachment.NewEncryptedFile()
	ciphertext := append([]byte(nil), pngBytes...)
	file.EncryptInPlace(ciphertext)
	raw, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	var fileJSON map[string]any
	if err := json.Unmarshal(raw, &fileJSON); err != nil {
		t.Fatal(err)
	}
	fileJSON["url"] = "mxc://example.org/secret"
	m := &media{files: map[string][]byte{"mxc://example.org/secret": ciphertext}}
	turn := execTurn(t, "$img", mx.Image("$img", alice, 1000).With("content", map[string]any{
		"msgtype": "m.image", "body": "cat.png", "file": fileJSON, "info": map[string]any{"mimetype": "image/png"}}))
	if reply, err := visionAgent(t, model, true, m).Answer(context.Background(), turn); err != nil || reply.Ignore {
		t.Fatalf("reply = %+v, %v; want an answer", reply, err)
	}
	// No caption (the body is the file's name): the image alone.
	want := "user: image " + dataURL("image/png", pngBytes)
	if got := describe(t, model.asked()[0]); strings.Join(got, "\n") != want {
		t.Fatalf("messages = %q, want %q", got, want)
	}
}

func TestOpenAISendsTheNewestImagesOfTheWindowOnly(t *testing.T) {
	model := startVisionModel(t)
	m := &media{files: map[string][]byte{}}
	var evs []mx.Ev
	for i := range agent.MaxVisionImages + 2 {
		url := fmt.Sprintf("mxc://example.org/img%d", i)
		m.files[url] = pngBytes
		evs = append(evs, captioned(fmt.Sprintf("$img%d", i), int64(1000*(i+1)), fmt.Sprintf("picture %d", i), url))
	}
	evs = append(evs, mx.Message("$q", alice, 100000, "which is the best?"))
	if _, err := visionAgent(t, model, true, m).Answer(context.Background(), execTurn(t, "$q", evs...)); err != nil {
		t.Fatal(err)
	}
	got := describe(t, model.asked()[0])
	// The two oldest are left out as without vision; the newest are sent.
	if len(got) != agent.MaxVisionImages+1 || !strings.HasPrefix(got[0], "user: picture 2 image data:image/png;base64,") ||
		got[len(got)-1] != "user: which is the best?" {
		t.Fatalf("messages = %q, want pictures 2 to %d with their images, then the question", got, agent.MaxVisionImages+1)
	}
	if len(m.asked) != agent.MaxVisionImages {
		t.Fatalf("fetched %d images, want %d", len(m.asked), agent.MaxVisionImages)
	}
}
