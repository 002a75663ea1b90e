package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"log"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// A message an agent posts on its own under an idempotency key is sent
// once, however the daemon dies: killed after the homeserver took the
// message but before the daemon learned its event ID, the restarted daemon
// answers the same key with the same delivery, which ends acknowledged as
// the one event the homeserver holds. The key with other content is
// refused, and sends nothing.
func TestAKeyedSendKilledBetweenSendAndAcknowledgementShowsOneMessage(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	bot := hs.Register(t, "poster", "poster-password-3a9d")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	door := startSendHold(t, keyedSend, hs.URL)
	const token = "api-token-of-the-posting-agent"
	cfg := writeHTTPAgentConfig(t, door.URL, bot, "poster", token)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	daemon := startDaemonProcess(t, bin, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", daemon.log)
		}
	})
	base := "http://" + daemonAddress(t, daemon.log) + "/v1/agents/poster"
	// Once the person's message is work, the journal knows the agent is in
	// the room.
	awaitPending(t, base, token, alice.SendText(room, "post something"))

	const key, body = "announcement-1", "posted on its own, once"
	door.arm()
	code, first := sendKeyed(t, base, token, room, key, body, true)
	if code != http.StatusOK || first.Outcome != "created" || first.State != "queued" ||
		!strings.HasPrefix(first.DeliveryID, "send:") || first.TxnID == "" {
		t.Fatalf("the send = %d %+v, want a created send, queued", code, first)
	}
	var shown string
	select {
	case shown = <-door.forwarded:
	case <-ctx.Done():
		t.Fatalf("the send never reached the homeserver; the daemon's log:\n%s", daemon.log)
	}
	if shown == "" {
		t.Fatal("the homeserver refused the send the proxy passed on")
	}
	// The daemon sent it, and does not know what became of it.
	if code, d := sendKeyed(t, base, token, room, key, body, true); code != http.StatusOK || d.Outcome != "replayed" ||
		d.State != "attempted" || d.EventID != "" {
		t.Fatalf("the send asked again while its answer is held = %d %+v, want it replayed, attempted, without an event ID", code, d)
	}
	daemon.kill(t)
	door.disarm()

	daemon = startDaemonProcess(t, bin, cfg)
	base = "http://" + daemonAddress(t, daemon.log) + "/v1/agents/poster"
	// The key in the body's key field is the same key as in the header.
	code, again := sendKeyed(t, base, token, room, key, body, false)
	if code != http.StatusOK || again.Outcome != "replayed" || again.DeliveryID != first.DeliveryID || again.TxnID != first.TxnID {
		t.Fatalf("the send asked again after the restart = %d %+v, want the replayed delivery %+v", code, again, first)
	}
	acked := awaitAcknowledged(t, "the keyed send", func() apiDelivery {
		_, d := sendKeyed(t, base, token, room, key, body, true)
		if d.Outcome != "replayed" || d.DeliveryID != first.DeliveryID {
			t.Fatalf("the send asked again = %+v, want the replayed delivery %s", d, first.DeliveryID)
		}
		return d
	})
	if acked.EventID != shown {
		t.Fatalf("the send was acknowledged as %s; the homeserver holds it as %s", acked.EventID, shown)
	}

	// The same key with other content is a conflict; it sends nothing,
	// which the next send, under another key, shows by arriving alone.
	const other = "other content under the same key"
	code, refused := sendKeyed(t, base, token, room, key, other, true)
	if code != http.StatusConflict || refused.Error.Code != "conflict" {
		t.Fatalf("the key with other content = %d %+v, want 409 conflict", code, refused)
	}
	const after = "posted after the conflict"
	if code, d := sendKeyed(t, base, token, room, "announcement-2", after, true); code != http.StatusOK || d.Outcome != "created" {
		t.Fatalf("the send under another key = %d %+v, want created", code, d)
	}
	next := awaitAcknowledged(t, "the second send", func() apiDelivery {
		_, d := sendKeyed(t, base, token, room, "announcement-2", after, true)
		return d
	})
	alice.AwaitEvent(ctx, room, dendrite.WithID(next.EventID))
	daemon.stop(t)

	bodies := map[string]int{}
	for _, e := range surfaceHistory(t, alice, room) {
		if e.Sender == bot.UserID && e.Type == "m.room.message" {
			bodies[e.Content.Body]++
			if e.Content.Body == body && e.EventID != shown {
				t.Fatalf("the room holds the message as %s too, beside %s", e.EventID, shown)
			}
		}
	}
	if bodies[body] != 1 || bodies[other] != 0 || bodies[after] != 1 || len(bodies) != 2 {
		t.Fatalf("the agent's messages in the room, by body: %v; want %q and %q once each", bodies, body, after)
	}
}

// A reaction asked for twice is one reaction in the room; withdrawn, the
// person sees it redacted, by one redaction however often the withdrawal
// is asked for.
func TestAReactionReachesThePersonOnceAndItsWithdrawalRedactsIt(t *testing.T) {
	s := startSurfaceAgent(t, "reactor")
	question := s.say(s.room, "react to this")
	const thumb = "👍"
	react := "/events/" + url.PathEscape(question) + "/react"
	byQuery := react + "?key=" + url.QueryEscape(thumb)

	var first, again apiDelivery
	if code := s.call("POST", react, `{"key":"`+thumb+`"}`, &first); code != http.StatusOK || first.Outcome != "created" {
		t.Fatalf("react = %d %+v, want created", code, first)
	}
	if code := s.call("POST", byQuery, "", &again); code != http.StatusOK || again.Outcome != "replayed" ||
		again.DeliveryID != first.DeliveryID {
		t.Fatalf("react again = %d %+v, want the replayed %s", code, again, first.DeliveryID)
	}
	reaction := awaitAcknowledged(t, "the reaction", func() apiDelivery {
		var d apiDelivery
		s.call("POST", byQuery, "", &d)
		if d.Outcome != "replayed" || d.DeliveryID != first.DeliveryID {
			t.Fatalf("react again = %+v, want the replayed %s", d, first.DeliveryID)
		}
		return d
	})
	s.alice.AwaitEvent(s.ctx, s.room, dendrite.WithID(reaction.EventID))
	var reactions []surfaceEvent
	for _, e := range surfaceHistory(t, s.alice, s.room) {
		if e.Sender == s.bot.UserID && e.Type == "m.reaction" {
			reactions = append(reactions, e)
		}
	}
	if len(reactions) != 1 || reactions[0].EventID != reaction.EventID {
		t.Fatalf("the agent's reactions in the room: %+v, want %s alone", reactions, reaction.EventID)
	}
	if rel := reactions[0].Content.RelatesTo; rel == nil || rel.RelType != "m.annotation" || rel.EventID != question || rel.Key != thumb {
		t.Fatalf("the reaction relates as %+v, want an annotation %s of %s", rel, thumb, question)
	}

	var withdrawal apiDelivery
	if code := s.call("DELETE", byQuery, "", &withdrawal); code != http.StatusOK || withdrawal.Outcome != "created" ||
		withdrawal.DeliveryID == reaction.DeliveryID {
		t.Fatalf("withdraw = %d %+v, want a created withdrawal", code, withdrawal)
	}
	redaction := awaitAcknowledged(t, "the withdrawal", func() apiDelivery {
		var d apiDelivery
		s.call("DELETE", byQuery, "", &d)
		if d.Outcome != "replayed" || d.DeliveryID != withdrawal.DeliveryID {
			t.Fatalf("withdraw again = %+v, want the replayed %s", d, withdrawal.DeliveryID)
		}
		return d
	})
	s.alice.AwaitEvent(s.ctx, s.room, dendrite.WithID(redaction.EventID))
	// Withdrawn once more, then a message the agent posts: it arrives
	// after anything the withdrawals could have sent.
	var last apiDelivery
	if code := s.call("DELETE", byQuery, "", &last); code != http.StatusOK || last.Outcome != "replayed" ||
		last.DeliveryID != withdrawal.DeliveryID || last.EventID != redaction.EventID {
		t.Fatalf("withdraw again = %d %+v, want the replayed %+v", code, last, redaction)
	}
	marker := s.post("marker-after-the-withdrawal", "after the withdrawal")

	redactions := 0
	for _, e := range surfaceHistory(t, s.alice, s.room) {
		switch {
		case e.EventID == reaction.EventID:
			if e.Unsigned.RedactedBecause == nil || e.Content.RelatesTo != nil {
				t.Fatalf("the person sees the withdrawn reaction as %+v, want it redacted", e)
			}
		case e.Sender == s.bot.UserID && e.Type == "m.room.redaction":
			if e.redacts() != reaction.EventID || e.EventID != redaction.EventID {
				t.Fatalf("the agent redacted %s as %s, want %s as %s", e.redacts(), e.EventID, reaction.EventID, redaction.EventID)
			}
			redactions++
		case e.EventID == marker && redactions != 1:
			t.Fatalf("the message after the withdrawal came after %d redactions, want 1", redactions)
		}
	}
	if redactions != 1 {
		t.Fatalf("the agent sent %d redactions, want 1", redactions)
	}
}

// The agent typing shows in the person's sync, and so does the read
// receipt the daemon sends once an event is settled: answered, or (in the
// default mode, settle) ignored, which moves the receipt on to it.
func TestTypingAndReadReceiptsReachThePersonsSync(t *testing.T) {
	s := startSurfaceAgent(t, "typist")
	question := s.say(s.room, "are you typing?")

	var typing struct {
		RoomID string `json:"room_id"`
		Typing bool   `json:"typing"`
	}
	if code := s.call("PUT", "/rooms/"+url.PathEscape(s.room)+"/typing", `{"typing":true,"timeout_ms":30000}`, &typing); code != http.StatusOK ||
		!typing.Typing || typing.RoomID != s.room {
		t.Fatalf("typing = %d %+v, want typing in %s", code, typing, s.room)
	}
	s.alice.AwaitEphemeral(s.ctx, s.room, func(raw json.RawMessage) bool {
		var ev struct {
			Type    string `json:"type"`
			Content struct {
				UserIDs []string `json:"user_ids"`
			} `json:"content"`
		}
		return json.Unmarshal(raw, &ev) == nil && ev.Type == "m.typing" && slices.Contains(ev.Content.UserIDs, s.bot.UserID)
	})

	if code := s.call("POST", "/events/"+url.PathEscape(question)+"/reply", `{"body":"yes, and done"}`, nil); code != http.StatusOK {
		t.Fatalf("reply: status %d", code)
	}
	s.alice.AwaitEphemeral(s.ctx, s.room, readBy(s.bot.UserID, question))

	aside := s.say(s.room, "never mind this one")
	if code := s.call("POST", "/events/"+url.PathEscape(aside)+"/ignore", "", nil); code != http.StatusOK {
		t.Fatalf("ignore: status %d", code)
	}
	s.alice.AwaitEphemeral(s.ctx, s.room, readBy(s.bot.UserID, aside))
}

// The room list shows each room the agent is in as the homeserver and the
// journal know it: its name, its encryption, its members, its newest
// message and the person's messages still owed an answer.
func TestTheRoomListAndMembersShowTheAgentsRooms(t *testing.T) {
	s := startSurfaceAgentIn(t, "lister", 2)
	named, other := s.rooms[0], s.rooms[1]
	s.alice.SetState(named, "m.room.name", "", map[string]string{"name": "The named room"})
	s.say(named, "first question")
	newest := s.say(named, "second question")
	s.say(other, "a question elsewhere")
	s.alice.SetState(other, "m.room.encryption", "", map[string]string{"algorithm": "m.megolm.v1.aes-sha2"})

	var list struct {
		Rooms []struct {
			RoomID          string `json:"room_id"`
			Name            string `json:"name"`
			Topic           string `json:"topic"`
			Encrypted       bool   `json:"encrypted"`
			Members         int    `json:"members"`
			NewestMessageTS int64  `json:"newest_message_ts"`
			Pending         int64  `json:"pending"`
		} `json:"rooms"`
	}
	if code := s.call("GET", "/rooms", "", &list); code != http.StatusOK {
		t.Fatalf("rooms: status %d", code)
	}
	if len(list.Rooms) != 2 {
		t.Fatalf("rooms = %+v, want %s and %s", list.Rooms, named, other)
	}
	var ts struct {
		TS int64 `json:"origin_server_ts"`
	}
	if err := json.Unmarshal(s.alice.AwaitEvent(s.ctx, named, dendrite.WithID(newest)), &ts); err != nil || ts.TS <= 0 {
		t.Fatalf("the newest message's timestamp: %v %d", err, ts.TS)
	}
	for _, r := range list.Rooms {
		switch r.RoomID {
		case named:
			if r.Name != "The named room" || r.Encrypted || r.Members != 2 || r.Pending != 2 || r.NewestMessageTS != ts.TS {
				t.Fatalf("the named room is listed as %+v; want its name, clear, 2 members, 2 pending, newest message at %d", r, ts.TS)
			}
		case other:
			if r.Name != "" || !r.Encrypted || r.Members != 2 || r.Pending != 1 || r.NewestMessageTS <= 0 {
				t.Fatalf("the other room is listed as %+v; want no name, encrypted, 2 members, 1 pending, a newest message", r)
			}
		default:
			t.Fatalf("rooms lists %s, a room the agent is not in", r.RoomID)
		}
	}

	var members struct {
		RoomID  string `json:"room_id"`
		Members []struct {
			UserID string `json:"user_id"`
		} `json:"members"`
	}
	if code := s.call("GET", "/rooms/"+url.PathEscape(named)+"/members", "", &members); code != http.StatusOK || members.RoomID != named {
		t.Fatalf("members = %d %+v", code, members)
	}
	var ids []string
	for _, m := range members.Members {
		ids = append(ids, m.UserID)
	}
	slices.Sort(ids)
	want := []string{s.alice.UserID, s.bot.UserID}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("the members are %v, want %v", ids, want)
	}
}

// Rooms the agent was invited to alike, before it started, and joined and
// never left, are listed under the same membership epoch: an epoch moves
// on only when a membership ends, and each room's membership is its own.
func TestRoomsJoinedAlikeAreListedUnderTheSameEpoch(t *testing.T) {
	s := startSurfaceAgentIn(t, "twins", 2)
	for _, room := range s.rooms {
		s.say(room, "a question")
	}
	var list struct {
		Rooms []struct {
			RoomID string `json:"room_id"`
			Epoch  int64  `json:"epoch"`
		} `json:"rooms"`
	}
	if code := s.call("GET", "/rooms", "", &list); code != http.StatusOK || len(list.Rooms) != 2 {
		t.Fatalf("rooms = %d %+v, want the agent's two rooms", code, list.Rooms)
	}
	if list.Rooms[0].Epoch != list.Rooms[1].Epoch {
		t.Fatalf("two rooms joined alike are listed under different epochs: %+v", list.Rooms)
	}
}

// An image a person uploads and sends is shown to the agent as an
// attachment, and the media route gives it the very bytes, as the type
// they were uploaded as. A file the homeserver does not have is not found.
func TestAnImageAPersonUploadsIsFetchedByteIdentical(t *testing.T) {
	s := startSurfaceAgent(t, "viewer")
	picture := noisePNG(t, 320, 320, 5)
	up, err := s.alice.Client.UploadBytesWithName(s.ctx, picture, "image/png", "noise.png")
	if err != nil {
		t.Fatal(err)
	}
	mxc := up.ContentURI
	info := map[string]any{"mimetype": "image/png", "size": len(picture), "w": 320, "h": 320}
	imageEvent := s.alice.Send(s.room, "m.room.message", map[string]any{"msgtype": "m.image", "body": "noise.png",
		"url": mxc.String(), "info": info})
	awaitPending(t, s.base, s.token, imageEvent)

	var page struct {
		Messages []struct {
			EventID    string `json:"event_id"`
			Attachment *struct {
				Msgtype string `json:"msgtype"`
				URL     string `json:"url"`
				Info    struct {
					Mimetype string `json:"mimetype"`
					Size     int    `json:"size"`
				} `json:"info"`
			} `json:"attachment"`
		} `json:"messages"`
	}
	if code := s.call("GET", "/rooms/"+url.PathEscape(s.room)+"/messages", "", &page); code != http.StatusOK {
		t.Fatalf("messages: status %d", code)
	}
	found := false
	for _, m := range page.Messages {
		if m.EventID != imageEvent {
			continue
		}
		found = true
		if a := m.Attachment; a == nil || a.Msgtype != "m.image" || a.URL != mxc.String() ||
			a.Info.Mimetype != "image/png" || a.Info.Size != len(picture) {
			t.Fatalf("the image's attachment is %+v, want m.image %s of %d bytes of image/png", a, mxc, len(picture))
		}
	}
	if !found {
		t.Fatalf("the page %+v lacks the image %s", page.Messages, imageEvent)
	}

	code, header, got := s.fetch("/media/" + url.PathEscape(mxc.Homeserver) + "/" + url.PathEscape(mxc.FileID))
	if code != http.StatusOK || !bytes.Equal(got, picture) {
		t.Fatalf("the media route answered %d with %d bytes, want the %d uploaded", code, len(got), len(picture))
	}
	if ct := header.Get("Content-Type"); ct != "image/png" {
		t.Fatalf("the media route answered Content-Type %q, want image/png", ct)
	}
	if cl := header.Get("Content-Length"); cl != strconv.Itoa(len(picture)) {
		t.Fatalf("the media route answered Content-Length %q, want %d", cl, len(picture))
	}

	code, _, missing := s.fetch("/media/" + url.PathEscape(mxc.Homeserver) + "/NoSuchMediaOnThisServer0123")
	var refusal apiDelivery
	if err := json.Unmarshal(missing, &refusal); code != http.StatusNotFound || err != nil || refusal.Error.Code != "not_found" {
		t.Fatalf("a missing file = %d %s, want 404 not_found", code, missing)
	}
}

// A reply carrying a file shows in the person's client as an image that
// replies to the message, whose URL downloads, as the person, to the bytes
// the agent sent. The same reply posted again sends nothing.
func TestAnAttachmentReplyShowsInThePersonsClient(t *testing.T) {
	s := startSurfaceAgent(t, "illustrator")
	question := s.say(s.room, "draw me something")
	picture := noisePNG(t, 200, 200, 6)
	const caption = "here is the drawing"
	replyPath := "/events/" + url.PathEscape(question) + "/reply"

	var first, again struct {
		DeliveryID string `json:"delivery_id"`
		Outcome    string `json:"outcome"`
	}
	if code := s.postFile(replyPath, `{"body":"`+caption+`"}`, "drawing.png", "image/png", picture, &first); code != http.StatusOK ||
		first.Outcome != "created" {
		t.Fatalf("the attachment reply = %d %+v, want created", code, first)
	}
	raw := s.alice.AwaitEvent(s.ctx, s.room, func(raw json.RawMessage) bool {
		e, ok := parseSurfaceEvent(raw)
		return ok && e.Sender == s.bot.UserID && e.Type == "m.room.message" && e.Content.Msgtype == "m.image"
	})
	e, _ := parseSurfaceEvent(raw)
	c := e.Content
	if c.Body != caption || c.Filename != "drawing.png" || c.Info.Mimetype != "image/png" || c.Info.Size != int64(len(picture)) {
		t.Fatalf("the person sees the reply as %+v, want the caption, drawing.png, image/png of %d bytes", c, len(picture))
	}
	if c.RelatesTo == nil || c.RelatesTo.InReplyTo == nil || c.RelatesTo.InReplyTo.EventID != question {
		t.Fatalf("the image relates as %+v, want a reply to %s", c.RelatesTo, question)
	}
	mxc, err := id.ParseContentURI(c.URL)
	if err != nil {
		t.Fatalf("the image's url %q: %v", c.URL, err)
	}
	got, err := s.alice.Client.DownloadBytes(s.ctx, mxc)
	if err != nil || !bytes.Equal(got, picture) {
		t.Fatalf("the person downloads %d bytes (%v), want the %d the agent sent", len(got), err, len(picture))
	}

	if code := s.postFile(replyPath, `{"body":"`+caption+`"}`, "drawing.png", "image/png", picture, &again); code != http.StatusOK ||
		again.Outcome != "replayed" || again.DeliveryID != first.DeliveryID {
		t.Fatalf("the reply posted again = %d %+v, want the replayed %s", code, again, first.DeliveryID)
	}
	marker := s.post("marker-after-the-drawing", "after the drawing")
	images := 0
	for _, h := range surfaceHistory(t, s.alice, s.room) {
		if h.Sender == s.bot.UserID && h.Content.Msgtype == "m.image" {
			images++
		}
		if h.EventID == marker {
			break
		}
	}
	if images != 1 {
		t.Fatalf("the room shows %d images from the agent, want 1", images)
	}
}

// surfaceAgent is an outside agent's daemon (the http back-end), run in
// the test's process, and a person, alice, in a room she made and the
// agent joined, on a Dendrite of the test's own.
type surfaceAgent struct {
	t     *testing.T
	bot   dendrite.Account
	alice *dendrite.User
	room  string
	// rooms are the rooms alice made for the agent, room first.
	rooms []string
	token string
	// base is the agent's API: http://ADDR/v1/agents/NAME.
	base string
	// ctx bounds the test's waits on the homeserver.
	ctx context.Context
}

func startSurfaceAgent(t *testing.T, name string) *surfaceAgent {
	t.Helper()
	return startSurfaceAgentIn(t, name, 1)
}

// startSurfaceAgentIn is startSurfaceAgent with n rooms, each made by alice
// with the agent invited before the daemon starts; the first is room.
func startSurfaceAgentIn(t *testing.T, name string, n int) *surfaceAgent {
	t.Helper()
	hs := dendrite.Start(t)
	bot := hs.Register(t, name, name+"-password-6f1e")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	rooms := make([]string, n)
	for i := range rooms {
		rooms[i] = alice.CreateRoom(bot.UserID)
	}
	token := "api-token-of-the-" + name + "-agent"
	d := runInProcess(writeHTTPAgentConfig(t, hs.URL, bot, name, token))
	t.Cleanup(func() {
		d.stopCleanly(t)
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", d.log)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &surfaceAgent{t: t, bot: bot, alice: alice, room: rooms[0], rooms: rooms, token: token, ctx: ctx,
		base: "http://" + daemonAddress(t, d.log) + "/v1/agents/" + name}
}

// call makes one JSON request to the agent's API (path under base).
func (s *surfaceAgent) call(method, path, body string, out any) int {
	s.t.Helper()
	return apiCall(s.t, method, s.base+path, s.token, body, out)
}

// say has alice send body into room and waits until it is the agent's
// pending work; it returns the message's event ID.
func (s *surfaceAgent) say(room, body string) string {
	s.t.Helper()
	eventID := s.alice.SendText(room, body)
	awaitPending(s.t, s.base, s.token, eventID)
	return eventID
}

// post has the agent post body into its room under key, waits until alice
// sees it, and returns its event ID.
func (s *surfaceAgent) post(key, body string) string {
	s.t.Helper()
	d := awaitAcknowledged(s.t, "the send "+key, func() apiDelivery {
		_, d := sendKeyed(s.t, s.base, s.token, s.room, key, body, true)
		return d
	})
	s.alice.AwaitEvent(s.ctx, s.room, dendrite.WithID(d.EventID))
	return d.EventID
}

// fetch GETs path of the agent's API and returns the answer whole.
func (s *surfaceAgent) fetch(path string) (int, http.Header, []byte) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.ctx, http.MethodGet, s.base+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	return surfaceDo(s.t, req, s.token)
}

// postFile POSTs message and a file to path as multipart/form-data, and
// decodes the JSON answer into out.
func (s *surfaceAgent) postFile(path, message, filename, contentType string, data []byte, out any) int {
	s.t.Helper()
	code, raw := postMultipart(s.t, s.ctx, s.base+path, s.token, nil, message, filename, contentType, data)
	if err := json.Unmarshal(raw, out); err != nil {
		s.t.Fatalf("POST %s: %d %s: %v", path, code, raw, err)
	}
	return code
}

// postMultipart POSTs message and a file to url as multipart/form-data,
// with header's fields too, and returns the answer.
func postMultipart(t *testing.T, ctx context.Context, url, token string, header http.Header, message, filename,
	contentType string, data []byte) (int, []byte) {
	t.Helper()
	req, err := multipartRequest(ctx, url, header, message, filename, contentType, data)
	if err != nil {
		t.Fatal(err)
	}
	code, _, raw := surfaceDo(t, req, token)
	return code, raw
}

// multipartRequest is a POST of message and a file to url as
// multipart/form-data, with header's fields too.
func multipartRequest(ctx context.Context, url string, header http.Header, message, filename, contentType string,
	data []byte) (*http.Request, error) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	part, err := mw.CreateFormField("message")
	if err == nil {
		_, err = part.Write([]byte(message))
	}
	if err == nil {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, filename))
		h.Set("Content-Type", contentType)
		part, err = mw.CreatePart(h)
	}
	if err == nil {
		_, err = part.Write(data)
	}
	if err == nil {
		err = mw.Close()
	}
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &buf)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	return req, nil
}

// surfaceDo makes req with the agent's token and returns the answer whole.
func surfaceDo(t *testing.T, req *http.Request, token string) (int, http.Header, []byte) {
	t.Helper()
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, raw
}

// apiDelivery is the agent API's answer about a delivery it asked for (a
// send, a reaction, a withdrawal), or its refusal.
type apiDelivery struct {
	DeliveryID string `json:"delivery_id"`
	TxnID      string `json:"txn_id"`
	Outcome    string `json:"outcome"`
	State      string `json:"state"`
	EventID    string `json:"event_id"`
	Error      struct {
		Code string `json:"code"`
	} `json:"error"`
}

// sendKeyed posts body into room through the agent at base under key, given
// in the Idempotency-Key header when inHeader, in the body's key field
// otherwise.
func sendKeyed(t *testing.T, base, token, room, key, body string, inHeader bool) (int, apiDelivery) {
	t.Helper()
	req := map[string]string{"body": body}
	if !inHeader {
		req["key"] = key
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := http.NewRequest(http.MethodPost, base+"/rooms/"+url.PathEscape(room)+"/send", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if inHeader {
		r.Header.Set("Idempotency-Key", key)
	}
	code, _, raw := surfaceDo(t, r, token)
	var d apiDelivery
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("send: %d %s: %v", code, raw, err)
	}
	return code, d
}

// awaitAcknowledged asks ask, a request its route answers with the same
// delivery each time, until the delivery is acknowledged, and returns
// that answer. A delivery that failed or was retired fails the test.
func awaitAcknowledged(t *testing.T, what string, ask func() apiDelivery) apiDelivery {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for {
		d := ask()
		switch d.State {
		case "acknowledged":
			if d.EventID == "" {
				t.Fatalf("%s is acknowledged without an event ID: %+v", what, d)
			}
			return d
		case "failed", "retired":
			t.Fatalf("%s ended %s: %+v", what, d.State, d)
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s was not acknowledged within a minute: %+v", what, d)
		}
	}
}

// readBy matches the m.receipt that marks eventID read by user, for
// AwaitEphemeral.
func readBy(user, eventID string) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var ev struct {
			Type    string                                           `json:"type"`
			Content map[string]map[string]map[string]json.RawMessage `json:"content"`
		}
		return json.Unmarshal(raw, &ev) == nil && ev.Type == "m.receipt" && ev.Content[eventID]["m.read"][user] != nil
	}
}

// surfaceEvent is a room event as these tests read it.
type surfaceEvent struct {
	EventID string `json:"event_id"`
	Sender  string `json:"sender"`
	Type    string `json:"type"`
	// Redacts is a redaction's target before room version 11; from it on,
	// the content carries it.
	Redacts string `json:"redacts"`
	Content struct {
		Msgtype  string `json:"msgtype"`
		Body     string `json:"body"`
		Filename string `json:"filename"`
		URL      string `json:"url"`
		Redacts  string `json:"redacts"`
		Info     struct {
			Mimetype string `json:"mimetype"`
			Size     int64  `json:"size"`
		} `json:"info"`
		RelatesTo *struct {
			RelType   string `json:"rel_type"`
			EventID   string `json:"event_id"`
			Key       string `json:"key"`
			InReplyTo *struct {
				EventID string `json:"event_id"`
			} `json:"m.in_reply_to"`
		} `json:"m.relates_to"`
	} `json:"content"`
	Unsigned struct {
		RedactedBecause json.RawMessage `json:"redacted_because"`
	} `json:"unsigned"`
}

// redacts is the event a redaction redacts.
func (e surfaceEvent) redacts() string {
	if e.Redacts != "" {
		return e.Redacts
	}
	return e.Content.Redacts
}

func parseSurfaceEvent(raw json.RawMessage) (surfaceEvent, bool) {
	var e surfaceEvent
	return e, json.Unmarshal(raw, &e) == nil
}

// surfaceHistory reads room's whole history as u sees it, oldest first.
func surfaceHistory(t *testing.T, u *dendrite.User, room string) []surfaceEvent {
	t.Helper()
	var out []surfaceEvent
	for _, raw := range u.Messages(room) {
		e, ok := parseSurfaceEvent(raw)
		if !ok {
			t.Fatalf("an event of %s does not parse: %s", room, raw)
		}
		out = append(out, e)
	}
	return out
}

// noisePNG is a w×h PNG of noise drawn from seed: about 4 bytes a pixel,
// since noise does not compress, and the same bytes for the same seed.
func noisePNG(t *testing.T, w, h int, seed uint64) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range img.Pix {
		img.Pix[i] = byte(r.Uint32())
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sendHold stands in front of the homeserver. Armed, it passes the
// agent's next send of the kind it holds on to the homeserver,
// reports the event ID the homeserver gave it on forwarded, and goes dark:
// the send's answer, and every answer the homeserver gives after it, is
// held until its caller goes away. The homeserver has the message, and the
// daemon can learn its event ID neither from the send's answer nor from a
// sync that would echo it.
type sendHold struct {
	URL       string
	armed     atomic.Bool
	dark      atomic.Bool
	forwarded chan string
}

func (h *sendHold) arm() { h.armed.Store(true) }

// disarm passes everything on again.
func (h *sendHold) disarm() {
	h.armed.Store(false)
	h.dark.Store(false)
}

// startSendHold starts the proxy, armed by the first send whose content
// holds says it is the one to hold.
func startSendHold(t *testing.T, holds func(body []byte) bool, homeserver string) *sendHold {
	t.Helper()
	target, err := url.Parse(homeserver)
	if err != nil {
		t.Fatal(err)
	}
	h := &sendHold{forwarded: make(chan string, 1)}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		// An answer the homeserver gives once dark is held: the event
		// exists only after the proxy went dark, so no answer naming it
		// passes.
		ModifyResponse: func(resp *http.Response) error {
			if !h.dark.Load() {
				return nil
			}
			ctx := resp.Request.Context()
			<-ctx.Done()
			return ctx.Err()
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) },
		ErrorLog:     log.New(io.Discard, "", 0),
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.armed.Load() && r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/send/") {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if holds(body) && h.armed.CompareAndSwap(true, false) {
				h.dark.Store(true)
				h.forwarded <- passHeld(target, r, body)
				<-r.Context().Done()
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	h.URL = srv.URL
	return h
}

// keyedSend reports whether a send's content is a delivery of the send
// route.
func keyedSend(body []byte) bool {
	var c struct {
		Delivery *struct {
			DeliveryID string `json:"delivery_id"`
		} `json:"io.mindroomd.delivery"`
	}
	return json.Unmarshal(body, &c) == nil && c.Delivery != nil && strings.HasPrefix(c.Delivery.DeliveryID, "send:")
}

// passHeld makes r, whose body is body, of the homeserver at target, and
// returns the event ID it answers with ("" for a refusal).
func passHeld(target *url.URL, r *http.Request, body []byte) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	out := r.Clone(ctx)
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host, out.Host = target.Scheme, target.Host, target.Host
	out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	out.Header.Del("Accept-Encoding")
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var sent struct {
		EventID string `json:"event_id"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&sent) != nil {
		return ""
	}
	return sent.EventID
}
