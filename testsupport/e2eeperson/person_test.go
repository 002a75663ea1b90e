package e2eeperson_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"maunium.net/go/mautrix/crypto"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

// hs is the Dendrite the package's tests share.
var hs *dendrite.Server

func TestMain(m *testing.M) { os.Exit(dendrite.RunTests(m, func(s *dendrite.Server) { hs = s })) }

// accounts numbers the users registered on the shared server, whose
// localparts must differ between tests.
var accounts atomic.Int64

// register makes an account named after name, unique on the server.
func register(t *testing.T, name string) dendrite.Account {
	t.Helper()
	localpart := fmt.Sprintf("%s-%d", name, accounts.Add(1))
	return hs.Register(t, localpart, localpart+"-password")
}

// person registers an account and logs a Person in on it.
func person(t *testing.T, name string) *e2eeperson.Person {
	t.Helper()
	return e2eeperson.New(t, hs, register(t, name))
}

// deadline bounds one test's waits on syncs.
func deadline(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wire is the part of an event as sent that the tests read.
type wire struct {
	ID      string `json:"event_id"`
	Type    string `json:"type"`
	Content struct {
		Algorithm  string `json:"algorithm"`
		Ciphertext string `json:"ciphertext"`
		SessionID  string `json:"session_id"`
		RelatesTo  *struct {
			RelType string `json:"rel_type"`
			EventID string `json:"event_id"`
		} `json:"m.relates_to"`
	} `json:"content"`
}

func parseWire(t *testing.T, raw json.RawMessage) wire {
	t.Helper()
	var w wire
	if err := json.Unmarshal(raw, &w); err != nil {
		t.Fatalf("event %s: %v", raw, err)
	}
	return w
}

// checkCiphertext fails t unless raw is a Megolm-encrypted event with no
// trace of body in clear.
func checkCiphertext(t *testing.T, raw json.RawMessage, body string) wire {
	t.Helper()
	w := parseWire(t, raw)
	if w.Type != "m.room.encrypted" || w.Content.Algorithm != "m.megolm.v1.aes-sha2" || w.Content.Ciphertext == "" || w.Content.SessionID == "" {
		t.Errorf("event %s on the wire is %s (algorithm %q), want megolm ciphertext", w.ID, w.Type, w.Content.Algorithm)
	}
	if strings.Contains(string(raw), body) {
		t.Errorf("event %s carries %q in clear: %s", w.ID, body, raw)
	}
	return w
}

// relation returns a content's m.relates_to rel_type and event_id.
func relation(content map[string]any) (relType, eventID string) {
	rel, _ := content["m.relates_to"].(map[string]any)
	relType, _ = rel["rel_type"].(string)
	eventID, _ = rel["event_id"].(string)
	return relType, eventID
}

func TestBobDecryptsTextEditAndThreadReplyAliceSentEncrypted(t *testing.T) {
	ctx := deadline(t)
	alice, bob := person(t, "alice"), person(t, "bob")
	room := alice.CreateEncryptedRoom(bob.UserID())
	bob.Join(room)

	hello := alice.SendText(room, "hello bob")
	edit := alice.Edit(room, hello, "hello, bob")
	reply := alice.ThreadReply(room, hello, "a thread of our own")

	_, content := bob.AwaitDecrypted(ctx, room, e2eeperson.WithID(hello))
	if content["msgtype"] != "m.text" || content["body"] != "hello bob" {
		t.Errorf("bob read the message as %v", content)
	}
	_, content = bob.AwaitDecrypted(ctx, room, e2eeperson.WithID(edit))
	newContent, _ := content["m.new_content"].(map[string]any)
	if relType, target := relation(content); relType != "m.replace" || target != hello || newContent["body"] != "hello, bob" {
		t.Errorf("bob read the edit as %v, want an m.replace of %s to %q", content, hello, "hello, bob")
	}
	_, content = bob.AwaitDecrypted(ctx, room, e2eeperson.WithID(reply))
	if relType, root := relation(content); relType != "m.thread" || root != hello || content["body"] != "a thread of our own" {
		t.Errorf("bob read the thread reply as %v, want it in the thread of %s", content, hello)
	}

	// What the server holds is ciphertext; the relations are also in the
	// envelope, where the server aggregates them.
	read := map[string]e2eeperson.Decrypted{}
	for _, d := range bob.DecryptedTimeline(room) {
		read[d.EventID] = d
	}
	for _, sent := range []struct{ id, body, relType string }{
		{hello, "hello bob", ""}, {edit, "hello, bob", "m.replace"}, {reply, "a thread of our own", "m.thread"},
	} {
		d, ok := read[sent.id]
		if !ok {
			t.Fatalf("bob's timeline lacks %s", sent.id)
		}
		if !d.Encrypted || d.Err != nil || d.Type != "m.room.message" || d.Sender != alice.UserID() {
			t.Errorf("bob's timeline has %s as %s from %s (encrypted %v, error %v)", sent.id, d.Type, d.Sender, d.Encrypted, d.Err)
		}
		w := checkCiphertext(t, d.Raw, sent.body)
		if sent.relType == "" {
			continue
		}
		if rel := w.Content.RelatesTo; rel == nil || rel.RelType != sent.relType || rel.EventID != hello {
			t.Errorf("envelope of %s relates as %+v, want %s to %s", sent.id, rel, sent.relType, hello)
		}
	}

	// The other way round, and a redaction, which stays in clear.
	answer := bob.SendText(room, "hi alice")
	if _, content := alice.AwaitDecrypted(ctx, room, e2eeperson.WithID(answer)); content["body"] != "hi alice" {
		t.Errorf("alice read bob's answer as %v", content)
	}
	redaction := alice.Redact(room, reply)
	if d := bob.Decrypt(ctx, room, redaction); d.Encrypted || d.Err != nil || d.Type != "m.room.redaction" {
		t.Errorf("bob read the redaction as %s (encrypted %v, error %v)", d.Type, d.Encrypted, d.Err)
	}
}

func TestAMessageWithheldFromBobDecryptsOnceItsKeyIsShared(t *testing.T) {
	ctx := deadline(t)
	alice, bob, carol := person(t, "alice"), person(t, "bob"), person(t, "carol")
	room := alice.CreateEncryptedRoom(bob.UserID(), carol.UserID())
	bob.Join(room)
	carol.Join(room)

	before := alice.SendText(room, "before")
	bob.AwaitDecrypted(ctx, room, e2eeperson.WithID(before))
	late := alice.SendTextWithheldFrom(room, "a key that comes late", bob.UserID())
	if _, content := carol.AwaitDecrypted(ctx, room, e2eeperson.WithID(late)); content["body"] != "a key that comes late" {
		t.Errorf("carol read the withheld message as %v", content)
	}
	d := bob.Decrypt(ctx, room, late)
	if !errors.Is(d.Err, crypto.ErrNoSessionFound) {
		t.Fatalf("bob read the withheld message as %s %v (error %v), want no session", d.Type, d.Content, d.Err)
	}
	checkCiphertext(t, d.Raw, "a key that comes late")

	// A message sent after it is in a session of its own: its key, which
	// bob gets, opens nothing of the withheld one.
	after := alice.SendText(room, "after")
	bob.AwaitDecrypted(ctx, room, e2eeperson.WithID(after))
	if d := bob.Decrypt(ctx, room, late); !errors.Is(d.Err, crypto.ErrNoSessionFound) {
		t.Fatalf("bob read the withheld message before its key was shared: %v (error %v)", d.Content, d.Err)
	}

	alice.ShareWithheldKeys(room)
	if _, content := bob.AwaitDecrypted(ctx, room, e2eeperson.WithID(late)); content["body"] != "a key that comes late" {
		t.Errorf("bob read the withheld message as %v once its key came", content)
	}
	if d := bob.Decrypt(ctx, room, late); d.Err != nil || !d.Encrypted {
		t.Errorf("bob's already-received copy reads as %v (encrypted %v, error %v)", d.Content, d.Encrypted, d.Err)
	}
}

func TestAKickStartsASessionTheKickedUserNeverGets(t *testing.T) {
	ctx := deadline(t)
	alice, bob := person(t, "alice"), person(t, "bob")
	room := alice.CreateEncryptedRoom(bob.UserID())
	bob.Join(room)

	before := alice.SendText(room, "while bob is here")
	bob.AwaitDecrypted(ctx, room, e2eeperson.WithID(before))
	alice.Kick(room, bob.UserID())
	after := alice.SendText(room, "after bob left")

	// alice reads her own messages through her copy of each session.
	first, second := alice.Decrypt(ctx, room, before), alice.Decrypt(ctx, room, after)
	if first.Err != nil || second.Err != nil || second.Content["body"] != "after bob left" {
		t.Fatalf("alice read her own messages as %v, %v (errors %v, %v)", first.Content, second.Content, first.Err, second.Err)
	}
	if a, b := parseWire(t, first.Raw).Content.SessionID, parseWire(t, second.Raw).Content.SessionID; a == b {
		t.Errorf("the message after the kick went out in the session bob has (%s)", a)
	}
}

func TestDeviceIsCrossSignedOnlyOnceItsOwnerSignedIt(t *testing.T) {
	ctx := deadline(t)
	alice := person(t, "alice")
	bobAccount := register(t, "bob")
	bob := e2eeperson.New(t, hs, bobAccount)

	crossSigned := func(userID, deviceID string) bool {
		t.Helper()
		signed, err := alice.DeviceIsCrossSigned(ctx, userID, deviceID)
		if err != nil {
			t.Fatalf("is device %s of %s cross-signed: %v", deviceID, userID, err)
		}
		return signed
	}
	if crossSigned(bob.UserID(), bob.DeviceID()) {
		t.Errorf("bob's device reads as cross-signed before bob had cross-signing keys")
	}

	bob.CrossSignOwnDevice()
	if !crossSigned(bob.UserID(), bob.DeviceID()) {
		t.Errorf("bob's device does not read as cross-signed after bob signed it")
	}
	// A second device of bob's, which bob's keys never signed.
	other := e2eeperson.New(t, hs, bobAccount)
	if crossSigned(other.UserID(), other.DeviceID()) {
		t.Errorf("bob's second device reads as cross-signed though bob never signed it")
	}
	if _, err := alice.DeviceIsCrossSigned(ctx, bob.UserID(), "NOSUCHDEVICE"); err == nil {
		t.Errorf("a device the server does not know reads without error")
	}
}
