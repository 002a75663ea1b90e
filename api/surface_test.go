package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	mxattachment "maunium.net/go/mautrix/crypto/attachment"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The fake homeserver stands in for the homeserver's answers in the API's
// own tests; the daemon's tests run the same routes against Dendrite.
const (
	fakeMediaServer = "example.org"
	fakeMediaID     = "abcDEF123"
)

var fakeMediaBytes = []byte("\x89PNG\r\n\x1a\n a small picture")

type typingCall struct {
	room    string
	typing  bool
	timeout time.Duration
}

type fakeHomeserver struct {
	mu      sync.Mutex
	typing  []typingCall
	uploads [][]byte
	// unknownLength serves the file without a length.
	unknownLength bool
	// files are more files by media ID.
	files map[string][]byte
}

func newFakeHomeserver() *fakeHomeserver { return &fakeHomeserver{} }

func (h *fakeHomeserver) Typing(_ context.Context, room string, typing bool, timeout time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.typing = append(h.typing, typingCall{room, typing, timeout})
	return nil
}

func (h *fakeHomeserver) JoinedRooms(context.Context) ([]string, error) {
	return []string{secAlphaRoom, room}, nil
}

func (h *fakeHomeserver) RoomSummary(_ context.Context, r string) (api.RoomSummary, error) {
	return api.RoomSummary{Name: "name of " + r, Encrypted: r == room, Members: 2}, nil
}

func (h *fakeHomeserver) JoinedMembers(context.Context, string) ([]api.Member, error) {
	return []api.Member{{UserID: alice, DisplayName: "Alice"}, {UserID: "@alpha:example.org"}}, nil
}

func (h *fakeHomeserver) Download(_ context.Context, server, mediaID string, _ int64) (*api.Media, error) {
	if b, ok := h.files[mediaID]; ok && server == fakeMediaServer {
		return &api.Media{Body: io.NopCloser(bytes.NewReader(b)), ContentType: "application/octet-stream",
			Length: int64(len(b))}, nil
	}
	if server != fakeMediaServer || mediaID != fakeMediaID {
		return nil, &api.UpstreamError{Status: http.StatusNotFound, ErrCode: "M_NOT_FOUND", Err: errors.New("no such media")}
	}
	n := int64(len(fakeMediaBytes))
	if h.unknownLength {
		n = -1
	}
	return &api.Media{Body: io.NopCloser(bytes.NewReader(fakeMediaBytes)), ContentType: "image/png", Length: n,
		Filename: "pic.png"}, nil
}

func (h *fakeHomeserver) Upload(_ context.Context, _, _, _ string, body io.Reader, size int64) (journal.Attachment, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return journal.Attachment{}, err
	}
	if int64(len(b)) != size {
		return journal.Attachment{}, errors.New("size differs from the body")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.uploads = append(h.uploads, b)
	return journal.Attachment{URL: "mxc://example.org/upload" + string(rune('a'+len(h.uploads)))}, nil
}

// surfaceFixture is the API fixture with a fake homeserver for alpha.
func surfaceFixture(t *testing.T, tune func(*api.Deps)) (*fixture, *fakeHomeserver) {
	hs := newFakeHomeserver()
	fx := newFixture(t, func(d *api.Deps) {
		a := d.Agents["alpha"]
		a.Homeserver = hs
		d.Agents["alpha"] = a
		if tune != nil {
			tune(d)
		}
	})
	return fx, hs
}

type deliveryBody struct {
	DeliveryID string `json:"delivery_id"`
	TxnID      string `json:"txn_id"`
	Outcome    string `json:"outcome"`
	State      string `json:"state"`
	EventID    string `json:"event_id"`
}

func sendKeyed(t *testing.T, fx *fixture, key, body string) (int, []byte) {
	t.Helper()
	resp := fx.send(t, http.MethodPost, "/v1/agents/alpha/rooms/"+room+"/send", alphaToken, strings.NewReader(body),
		http.Header{"Idempotency-Key": {key}})
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestAKeyedSendIsOneDeliveryWhateverTimesItIsAsked(t *testing.T) {
	fx, _ := surfaceFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "hello"))
	status, b := sendKeyed(t, fx, "report-2026-12-02", `{"body":"the daily report"}`)
	if status != http.StatusOK {
		t.Fatalf("send: %d %s", status, b)
	}
	first := decode[deliveryBody](t, b)
	if first.Outcome != "created" || first.DeliveryID != journal.SendDeliveryID(room, "report-2026-12-02") {
		t.Fatalf("first send = %+v", first)
	}
	status, b = sendKeyed(t, fx, "report-2026-12-02", `{"body":"the daily report"}`)
	again := decode[deliveryBody](t, b)
	if status != http.StatusOK || again.Outcome != "replayed" || again.TxnID != first.TxnID {
		t.Fatalf("the same send again = %d %s, want the first delivery replayed", status, b)
	}
	status, b = sendKeyed(t, fx, "report-2026-12-02", `{"body":"another report"}`)
	wantError(t, status, b, http.StatusConflict, "conflict")
	rows, err := fx.alpha.Unacknowledged(context.Background(), 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].DeliveryID != first.DeliveryID || rows[0].Thread != nil {
		t.Fatalf("the outbox holds %+v, want the one send", rows)
	}
	if ids := fx.pendingIDs(t); len(ids) != 1 {
		t.Fatalf("a send settled work: pending %v", ids)
	}
}

func TestASendNeedsAKeyAndARoomTheAgentIsIn(t *testing.T) {
	fx, _ := surfaceFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "hello"))
	status, b := fx.do(t, http.MethodPost, "/v1/agents/alpha/rooms/"+room+"/send", alphaToken,
		strings.NewReader(`{"body":"no key"}`))
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
	status, b = sendKeyed(t, fx, "k", `{"body":"x","key":"other"}`)
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
	status, b = sendKeyed(t, fx, "k", `{"body":""}`)
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
	status, b = sendKeyed(t, fx, "k", `{"body":"x","msgtype":"m.image"}`)
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
	status, b = sendKeyed(t, fx, "k", `{"body":"x","reply_to":"$never"}`)
	wantError(t, status, b, http.StatusNotFound, "not_found")
	resp := fx.send(t, http.MethodPost, "/v1/agents/alpha/rooms/"+otherRoom+"/send", alphaToken,
		strings.NewReader(`{"body":"x"}`), http.Header{"Idempotency-Key": {"k"}})
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	wantError(t, resp.StatusCode, b, http.StatusConflict, "conflict")
	if rows, _ := fx.alpha.Unacknowledged(context.Background(), 100, nil); len(rows) != 0 {
		t.Fatalf("refused sends enqueued %+v", rows)
	}
}

func TestASendReplyingToAThreadedEventGoesIntoItsThread(t *testing.T) {
	fx, _ := surfaceFixture(t, nil)
	fx.admit(t, room, mx.Message("$root", alice, 1000, "root"), mx.ThreadReply("$in", alice, 1001, "$root", "inside"))
	status, b := sendKeyed(t, fx, "k", `{"body":"answer","reply_to":"$in"}`)
	if status != http.StatusOK {
		t.Fatalf("send: %d %s", status, b)
	}
	d, err := fx.alpha.Delivery(context.Background(), journal.SendDeliveryID(room, "k"), journal.StageFinal)
	if err != nil {
		t.Fatal(err)
	}
	if d.Thread == nil || *d.Thread != "$root" || !bytes.Contains(d.Content, []byte(`"m.in_reply_to":{"event_id":"$in"}`)) {
		t.Fatalf("the send went to thread %v with %s", d.Thread, d.Content)
	}
}

// ack stands in for the outbox: it claims and acknowledges a delivery.
func ack(t *testing.T, v journal.PrincipalStore, id, eventID string) {
	t.Helper()
	ctx := context.Background()
	if _, err := v.Claim(ctx, id, journal.StageFinal, "DEV"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Acknowledge(ctx, id, journal.StageFinal, journal.Sent{EventID: eventID}); err != nil {
		t.Fatal(err)
	}
}

func TestAReactionIsSentOnceAndWithdrawnOnce(t *testing.T) {
	fx, _ := surfaceFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "hello"))
	react := func(method, body string) (int, deliveryBody, []byte) {
		path := "/v1/agents/alpha/events/$q/react"
		if method == http.MethodDelete {
			path += "?key=%F0%9F%91%8D"
		}
		status, b := fx.do(t, method, path, alphaToken, strings.NewReader(body))
		if status != http.StatusOK {
			return status, deliveryBody{}, b
		}
		return status, decode[deliveryBody](t, b), b
	}
	status, _, b := react(http.MethodDelete, "")
	wantError(t, status, b, http.StatusNotFound, "not_found")
	_, first, _ := react(http.MethodPost, `{"key":"👍"}`)
	_, again, _ := react(http.MethodPost, `{"key":"👍"}`)
	if first.Outcome != "created" || again.Outcome != "replayed" || again.DeliveryID != first.DeliveryID {
		t.Fatalf("react twice = %+v then %+v", first, again)
	}
	// Withdrawn before it was sent: retired, nothing to redact.
	_, gone, _ := react(http.MethodDelete, "")
	if gone.Outcome != "withdrawn" || gone.State != "retired" {
		t.Fatalf("withdrawing an unsent reaction = %+v", gone)
	}
	// Added again: a new delivery, which is sent and then redacted.
	_, second, _ := react(http.MethodPost, `{"key":"👍"}`)
	if second.Outcome != "created" || second.DeliveryID == first.DeliveryID {
		t.Fatalf("the reaction added again = %+v", second)
	}
	ack(t, fx.alpha, second.DeliveryID, "$reaction")
	_, undo, _ := react(http.MethodDelete, "")
	_, undoAgain, _ := react(http.MethodDelete, "")
	if undo.Outcome != "created" || undoAgain.Outcome != "replayed" || undoAgain.DeliveryID != undo.DeliveryID {
		t.Fatalf("withdraw twice = %+v then %+v", undo, undoAgain)
	}
	d, err := fx.alpha.Delivery(context.Background(), undo.DeliveryID, journal.StageFinal)
	if err != nil {
		t.Fatal(err)
	}
	if d.EventType != journal.TypeRedaction || !bytes.Contains(d.Content, []byte(`"redacts":"$reaction"`)) {
		t.Fatalf("the withdrawal is %s %s, want a redaction of the reaction", d.EventType, d.Content)
	}
	status, _, b = react(http.MethodPost, `{"key":""}`)
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
}

func TestTypingGoesStraightToTheHomeserver(t *testing.T) {
	fx, hs := surfaceFixture(t, nil)
	status, b := fx.do(t, http.MethodPut, "/v1/agents/alpha/rooms/"+room+"/typing", alphaToken,
		strings.NewReader(`{"typing":true,"timeout_ms":5000}`))
	if status != http.StatusOK {
		t.Fatalf("typing: %d %s", status, b)
	}
	status, b = fx.do(t, http.MethodPut, "/v1/agents/alpha/rooms/"+room+"/typing", alphaToken,
		strings.NewReader(`{"typing":true,"timeout_ms":999999}`))
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
	status, b = fx.do(t, http.MethodPut, "/v1/agents/alpha/rooms/"+room+"/typing", alphaToken, strings.NewReader(`{}`))
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if len(hs.typing) != 1 || hs.typing[0] != (typingCall{room, true, 5 * time.Second}) {
		t.Fatalf("typing calls = %+v", hs.typing)
	}
	// An agent with no homeserver connection says so.
	status, b = fx.do(t, http.MethodPut, "/v1/agents/beta/rooms/"+room+"/typing", betaToken, strings.NewReader(`{"typing":false}`))
	wantError(t, status, b, http.StatusNotImplemented, "not_implemented")
}

func TestTheRoomListJoinsTheHomeserversRoomsWithTheJournals(t *testing.T) {
	fx, _ := surfaceFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "hello"), mx.Message("$r", alice, 1500, "again"))
	status, b := fx.do(t, http.MethodGet, "/v1/agents/alpha/rooms", alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("rooms: %d %s", status, b)
	}
	got := decode[struct {
		Rooms []struct {
			RoomID    string `json:"room_id"`
			Name      string `json:"name"`
			Encrypted bool   `json:"encrypted"`
			Members   int    `json:"members"`
			Newest    int64  `json:"newest_message_ts"`
			Pending   int64  `json:"pending"`
		} `json:"rooms"`
	}](t, b).Rooms
	if len(got) != 2 || got[0].RoomID != secAlphaRoom || got[1].RoomID != room {
		t.Fatalf("rooms = %+v", got)
	}
	if r := got[1]; r.Name != "name of "+room || !r.Encrypted || r.Members != 2 || r.Newest != 1500 || r.Pending != 2 {
		t.Fatalf("the journaled room = %+v", r)
	}
	if r := got[0]; r.Newest != 0 || r.Pending != 0 {
		t.Fatalf("a room the journal never saw = %+v", r)
	}
	status, b = fx.do(t, http.MethodGet, "/v1/agents/alpha/rooms/"+room+"/members", alphaToken, nil)
	if status != http.StatusOK || !bytes.Contains(b, []byte(`"user_id":"`+alice+`"`)) {
		t.Fatalf("members: %d %s", status, b)
	}
}

func TestMediaStreamsWithItsTypeAndRefusesWhatIsNotThereOrTooLarge(t *testing.T) {
	for _, unknown := range []bool{false, true} {
		fx, hs := surfaceFixture(t, nil)
		hs.unknownLength = unknown
		resp := fx.send(t, http.MethodGet, "/v1/agents/alpha/media/"+fakeMediaServer+"/"+fakeMediaID, alphaToken, nil, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Equal(b, fakeMediaBytes) || resp.Header.Get("Content-Type") != "image/png" {
			t.Fatalf("download (unknown length %v): %d %q %q", unknown, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		status, b := fx.do(t, http.MethodGet, "/v1/agents/alpha/media/"+fakeMediaServer+"/nothing", alphaToken, nil)
		wantError(t, status, b, http.StatusNotFound, "not_found")
		small, shs := surfaceFixture(t, func(d *api.Deps) { d.MaxMedia = 8 })
		shs.unknownLength = unknown
		status, b = small.do(t, http.MethodGet, "/v1/agents/alpha/media/"+fakeMediaServer+"/"+fakeMediaID, alphaToken, nil)
		wantError(t, status, b, http.StatusRequestEntityTooLarge, "payload_too_large")
	}
}

func TestAnAttachmentSendUploadsOnceAndShowsInPages(t *testing.T) {
	fx, hs := surfaceFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "hello"))
	form := func(caption string) (io.Reader, string) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="message"`)
		p, _ := mw.CreatePart(h)
		_, _ = p.Write([]byte(`{"body":"` + caption + `"}`))
		h = textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="pic.png"`)
		h.Set("Content-Type", "image/png")
		p, _ = mw.CreatePart(h)
		_, _ = p.Write(fakeMediaBytes)
		_ = mw.Close()
		return &buf, mw.FormDataContentType()
	}
	post := func(caption string) (int, []byte) {
		body, ctype := form(caption)
		resp := fx.send(t, http.MethodPost, "/v1/agents/alpha/rooms/"+room+"/send", alphaToken, body,
			http.Header{"Idempotency-Key": {"pic"}, "Content-Type": {ctype}})
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if status, b := post("a picture"); status != http.StatusOK {
		t.Fatalf("attachment send: %d %s", status, b)
	}
	if status, b := post("a picture"); status != http.StatusOK || decode[deliveryBody](t, b).Outcome != "replayed" {
		t.Fatalf("the same attachment again: %d %s", status, b)
	}
	status, b := post("another caption")
	wantError(t, status, b, http.StatusConflict, "conflict")
	hs.mu.Lock()
	uploads := len(hs.uploads)
	hs.mu.Unlock()
	if uploads != 1 {
		t.Fatalf("%d uploads, want 1: a replayed send uploads nothing", uploads)
	}
	d, err := fx.alpha.Delivery(context.Background(), journal.SendDeliveryID(room, "pic"), journal.StageFinal)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"msgtype":"m.image"`, `"url":"mxc://example.org/uploadb"`, `"body":"a picture"`,
		`"filename":"pic.png"`, `"mimetype":"image/png"`} {
		if !bytes.Contains(d.Content, []byte(want)) {
			t.Fatalf("the attachment's content %s lacks %s", d.Content, want)
		}
	}
	ack(t, fx.alpha, d.DeliveryID, "$pic")
}

func TestTheChangesStreamNamesEachRoomACommitTouched(t *testing.T) {
	fx, _ := surfaceFixture(t, nil)
	resp := fx.send(t, http.MethodGet, "/v1/agents/alpha/changes", alphaToken, nil, nil)
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, ":") {
		t.Fatalf("the stream opens with %q, %v", line, err)
	}
	fx.admit(t, room, mx.Message("$q", alice, 1000, "hello"))
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended: %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			if want := `{"room_id":"` + room + `"}`; strings.TrimSpace(line[len("data: "):]) != want {
				t.Fatalf("change = %s, want %s", line, want)
			}
			return
		}
	}
}

func TestAnEncryptedRoomsFileIsServedDecryptedAndATamperedOneRefused(t *testing.T) {
	fx, hs := surfaceFixture(t, nil)
	ef := mxattachment.NewEncryptedFile()
	cipher := bytes.Clone(fakeMediaBytes)
	ef.EncryptInPlace(cipher)
	tampered := bytes.Clone(cipher)
	tampered[0] ^= 1
	hs.files = map[string][]byte{"sealed": cipher, "altered": tampered}
	file := func(id string) map[string]any {
		var f map[string]any
		b, _ := json.Marshal(ef)
		_ = json.Unmarshal(b, &f)
		f["url"] = "mxc://" + fakeMediaServer + "/" + id
		return f
	}
	img := func(evID, id string) mx.Ev {
		return mx.Message(evID, alice, 1000, "").With("content", map[string]any{"msgtype": "m.image", "body": "pic.png",
			"file": file(id), "info": map[string]any{"mimetype": "image/png", "size": len(fakeMediaBytes)}})
	}
	fx.admit(t, room, img("$sealed", "sealed"), img("$altered", "altered"))
	status, b := fx.do(t, http.MethodGet, "/v1/agents/alpha/rooms/"+room+"/messages", alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("page: %d %s", status, b)
	}
	page := decode[struct {
		Messages []struct {
			EventID    string `json:"event_id"`
			Attachment *struct {
				URL       string `json:"url"`
				Encrypted bool   `json:"encrypted"`
				Path      string `json:"path"`
			} `json:"attachment"`
		} `json:"messages"`
	}](t, b)
	paths := map[string]string{}
	for _, m := range page.Messages {
		if m.Attachment == nil || !m.Attachment.Encrypted || !strings.HasPrefix(m.Attachment.Path, "media/"+fakeMediaServer+"/") {
			t.Fatalf("the page shows %s's file as %+v", m.EventID, m.Attachment)
		}
		paths[m.EventID] = m.Attachment.Path
	}
	resp := fx.send(t, http.MethodGet, "/v1/agents/alpha/"+paths["$sealed"], alphaToken, nil, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, fakeMediaBytes) || resp.Header.Get("Content-Type") != "image/png" {
		t.Fatalf("the sealed file: %d %q %q, want the clear bytes as image/png", resp.StatusCode, resp.Header.Get("Content-Type"), got)
	}
	status, b = fx.do(t, http.MethodGet, "/v1/agents/alpha/"+paths["$altered"], alphaToken, nil)
	wantError(t, status, b, http.StatusBadGateway, "homeserver_error")
	status, b = fx.do(t, http.MethodGet, "/v1/agents/alpha/media/"+fakeMediaServer+"/sealed?file=bm90IGEga2V5", alphaToken, nil)
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
}
