package agent

import (
	"encoding/json"
	"errors"
	"maps"
	"mime"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// FuzzExecReply feeds arbitrary stdout to the exec agent's reply parser. It
// never panics; output that is not exactly one JSON object holding exactly
// one of a non-empty text "body", "ignore": true, a valid "react" key, an
// "attachment" object with a path or an "approval" object with a call ID,
// a tool and arguments is ErrExecReply; and an accepted reply
// says what the object says, as the oracle below reads it with the
// standard decoder alone.
func FuzzExecReply(f *testing.F) {
	for _, s := range []string{
		`{"body":"hello"}`,
		"{\"body\": \"hello\"}\n",
		"\r\n\t {\"ignore\": true} \n",
		`{"ignore":true}`,
		`{"b\u006fdy":"escaped key"}`,
		`{"body":"` + "\xff\xfe" + ` not UTF-8"}`,
		`{"body":"\ud800 a lone surrogate"}`,
		`{"body":"thinking…\n\n**done**"}`,
		`{"body":"a","body":""}`,
		`{"ignore":false,"ignore":true}`,
		"",
		"   \n",
		"hello",
		`["hi"]`,
		"null",
		`"body"`,
		`{"body":"hi","ignore":true}`,
		`{}`,
		`{"body":""}`,
		`{"body":7}`,
		`{"body":null}`,
		`{"ignore":false}`,
		`{"ignore":"true"}`,
		`{"ignore":1}`,
		`{"body":"hi","format":"markdown"}`,
		`{"BODY":"hi"}`,
		`{"body":"hi"} and more`,
		`{"body":"hi"}{"body":"again"}`,
		`{"body":"unterminated`,
		`{"react":"👍"}`,
		`{"react":"👍🏽"}`,
		`{"react":" 👍"}`,
		`{"react":""}`,
		`{"react":"a\u0007"}`,
		`{"react":7}`,
		`{"react":"` + strings.Repeat("x", journal.MaxReactionKeyBytes+1) + `"}`,
		`{"react":"👍","body":"and words"}`,
		`{"react":"👍","ignore":true}`,
		`{"attachment":{"path":"/tmp/out.png"}}`,
		`{"attachment":{"path":"out.png","name":"chart.png","mimetype":"image/png","caption":"the chart"}}`,
		`{"attachment":{"path":"a","mimetype":"text/plain; charset=utf-8"}}`,
		`{"attachment":{"path":"a","mimetype":"not a type"}}`,
		`{"attachment":{"path":""}}`,
		`{"attachment":{"path":"a\u0000b"}}`,
		`{"attachment":{"name":"no path"}}`,
		`{"attachment":{"path":"a","size":3}}`,
		`{"attachment":{"path":"a","caption":null}}`,
		`{"attachment":"/tmp/out.png"}`,
		`{"attachment":null}`,
		`{"attachment":{"path":"a"},"body":"caption here"}`,
		`{"approval":{"call_id":"c1","tool":"send_mail","arguments":{"to":"bob@example.org"}}}`,
		`{"approval":{"call_id":"c1","tool":"send_mail","arguments":{},"approvers":["@alice:example.org"],"expires_in_s":3600,"secret":["token"],"rendering":"Mail Bob?"}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":2.5}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":0.5}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":604801}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":"60"}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":1e400}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":[]}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":null}}`,
		`{"approval":{"call_id":"c1","tool":"t"}}`,
		`{"approval":{"call_id":"","tool":"t","arguments":{}}}`,
		`{"approval":{"call_id":"c1","tool":null,"arguments":{}}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{},"approvers":null}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{},"approvers":["@a:b",7]}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{},"secret":"token"}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{},"state":"approved"}}`,
		`{"approval":{"c\u0061ll_id":"c1","tool":"t","arguments":{ "a" : [1, {"b": null}] }}}`,
		`{"approval":{"call_id":"c1","tool":"t","arguments":{}},"body":"and words"}`,
		`{"approval":"c1"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		reply, err := parseReply(out)
		want, valid := oracleReply(out)
		if !valid {
			if !errors.Is(err, ErrExecReply) {
				t.Fatalf("parseReply(%q) = %+v, %v; want ErrExecReply", out, reply, err)
			}
			if reply.Ignore || reply.Content != nil || reply.React != "" || reply.Attachment != nil || reply.Approval != nil {
				t.Fatalf("parseReply(%q) refused with a reply %+v", out, reply)
			}
			return
		}
		if err != nil {
			t.Fatalf("parseReply(%q) = %v; want %+v", out, err, want)
		}
		if err := reply.Validate(); err != nil {
			t.Fatalf("parseReply(%q) = %+v, which is not a valid reply: %v", out, reply, err)
		}
		switch {
		case want.ignore:
			if !reply.Ignore {
				t.Fatalf("parseReply(%q) = %+v; want an ignore", out, reply)
			}
			return
		case want.react != "":
			if reply.React != want.react {
				t.Fatalf("parseReply(%q) = %+v; want the reaction %q", out, reply, want.react)
			}
			return
		case want.file != nil:
			if reply.Attachment == nil || *reply.Attachment != *want.file {
				t.Fatalf("parseReply(%q) = %+v; want the attachment %+v", out, reply.Attachment, *want.file)
			}
			return
		case want.ask != nil:
			if !sameAsk(reply.Approval, want.ask) {
				t.Fatalf("parseReply(%q) = %+v; want the approval %+v", out, reply.Approval, *want.ask)
			}
			return
		}
		var content map[string]string
		if err := json.Unmarshal(reply.Content, &content); err != nil {
			t.Fatalf("content %q: %v", reply.Content, err)
		}
		if w := map[string]string{"msgtype": "m.text", "body": want.body}; !maps.Equal(content, w) {
			t.Fatalf("parseReply(%q) content = %v; want %v", out, content, w)
		}
	})
}

type oracleAnswer struct {
	body   string
	ignore bool
	react  string
	file   *File
	ask    *ApprovalAsk
}

// oracleReply is the reply contract read independently of parseReply: the
// whole output is one JSON value (JSON's own whitespace around it allowed),
// an object whose keys are among body, ignore, react, attachment and
// approval, with exactly one of them: a non-empty string body, ignore true,
// a react string that is a valid reaction key, an attachment object whose
// keys are among path, name, mimetype and caption, each a string, with a
// non-empty path free of NUL and a mimetype, when not empty, that is a
// media type, or an approval object (oracleAsk).
func oracleReply(out []byte) (oracleAnswer, bool) {
	if !json.Valid(out) {
		return oracleAnswer{}, false
	}
	var v any
	if json.Unmarshal(out, &v) != nil {
		return oracleAnswer{}, false
	}
	obj, ok := v.(map[string]any)
	if !ok || len(obj) != 1 {
		return oracleAnswer{}, false
	}
	for k, v := range obj {
		switch k {
		case "ignore":
			return oracleAnswer{ignore: true}, v == true
		case "body":
			s, ok := v.(string)
			return oracleAnswer{body: s}, ok && s != ""
		case "react":
			s, ok := v.(string)
			return oracleAnswer{react: s}, ok && journal.ValidReactionKey(s)
		case "attachment":
			file, ok := oracleFile(v)
			return oracleAnswer{file: file}, ok
		case "approval":
			ask, ok := oracleAsk(v)
			return oracleAnswer{ask: ask}, ok
		}
	}
	return oracleAnswer{}, false
}

func oracleFile(v any) (*File, bool) {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, false
	}
	s := map[string]string{}
	for k, v := range obj {
		str, ok := v.(string)
		if !ok || (k != "path" && k != "name" && k != "mimetype" && k != "caption") {
			return nil, false
		}
		s[k] = str
	}
	if s["path"] == "" || strings.Contains(s["path"], "\x00") {
		return nil, false
	}
	if s["mimetype"] != "" {
		if _, _, err := mime.ParseMediaType(s["mimetype"]); err != nil {
			return nil, false
		}
	}
	return &File{Path: s["path"], Name: s["name"], MimeType: s["mimetype"], Caption: s["caption"]}, true
}

// oracleAsk reads an approval object: its keys among call_id, tool,
// arguments, approvers, expires_in_s, secret and rendering; call_id and
// tool non-empty strings, arguments an object, approvers and secret lists
// of strings, expires_in_s a number of seconds from 1 to a week, rendering
// a string.
func oracleAsk(v any) (*ApprovalAsk, bool) {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, false
	}
	ask := &ApprovalAsk{}
	strs := func(v any) ([]string, bool) {
		list, ok := v.([]any)
		if !ok {
			return nil, false
		}
		out := []string{}
		for _, item := range list {
			s, ok := item.(string)
			if !ok {
				return nil, false
			}
			out = append(out, s)
		}
		return out, true
	}
	for k, v := range obj {
		ok := true
		switch k {
		case "call_id":
			ask.CallID, ok = v.(string)
		case "tool":
			ask.Tool, ok = v.(string)
		case "rendering":
			ask.Rendering, ok = v.(string)
		case "approvers":
			ask.Approvers, ok = strs(v)
		case "secret":
			ask.Secret, ok = strs(v)
		case "arguments":
			var args map[string]any
			if args, ok = v.(map[string]any); ok {
				ask.Arguments, _ = json.Marshal(args)
			}
		case "expires_in_s":
			var s float64
			s, ok = v.(float64)
			ok = ok && s >= 1 && s <= 7*24*3600
			ask.ExpiresIn = time.Duration(s * float64(time.Second))
		default:
			ok = false
		}
		if !ok {
			return nil, false
		}
	}
	return ask, ask.CallID != "" && ask.Tool != "" && ask.Arguments != nil
}

// sameAsk compares two approvals, their arguments as JSON values.
func sameAsk(got, want *ApprovalAsk) bool {
	if got == nil {
		return false
	}
	var ga, wa any
	if json.Unmarshal(got.Arguments, &ga) != nil || json.Unmarshal(want.Arguments, &wa) != nil || !reflect.DeepEqual(ga, wa) {
		return false
	}
	return got.CallID == want.CallID && got.Tool == want.Tool && got.Rendering == want.Rendering &&
		got.ExpiresIn == want.ExpiresIn && slices.Equal(got.Approvers, want.Approvers) && slices.Equal(got.Secret, want.Secret)
}
