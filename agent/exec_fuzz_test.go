package agent

import (
	"encoding/json"
	"errors"
	"maps"
	"testing"
)

// FuzzExecReply feeds arbitrary stdout to the exec agent's reply parser. It
// never panics; output that is not exactly one JSON object holding a
// non-empty text "body" or "ignore": true is ErrExecReply; and an accepted
// reply says what the object says, as the oracle below reads it with the
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
			if reply.Ignore || reply.Content != nil {
				t.Fatalf("parseReply(%q) refused with a reply %+v", out, reply)
			}
			return
		}
		if err != nil {
			t.Fatalf("parseReply(%q) = %v; want %+v", out, err, want)
		}
		if want.ignore {
			if !reply.Ignore || reply.Content != nil {
				t.Fatalf("parseReply(%q) = %+v; want an ignore", out, reply)
			}
			return
		}
		if reply.Ignore {
			t.Fatalf("parseReply(%q) ignores; want the body %q", out, want.body)
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
}

// oracleReply is the reply contract read independently of parseReply: the
// whole output is one JSON value (JSON's own whitespace around it allowed),
// an object whose keys are exactly body or ignore, with exactly one of a
// non-empty string body and ignore true.
func oracleReply(out []byte) (oracleAnswer, bool) {
	if !json.Valid(out) {
		return oracleAnswer{}, false
	}
	var v any
	if json.Unmarshal(out, &v) != nil {
		return oracleAnswer{}, false
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return oracleAnswer{}, false
	}
	for k := range obj {
		if k != "body" && k != "ignore" {
			return oracleAnswer{}, false
		}
	}
	body, hasBody := obj["body"]
	ignore, hasIgnore := obj["ignore"]
	switch {
	case hasBody && hasIgnore:
		return oracleAnswer{}, false
	case hasIgnore:
		return oracleAnswer{ignore: true}, ignore == true
	case hasBody:
		s, ok := body.(string)
		return oracleAnswer{body: s}, ok && s != ""
	}
	return oracleAnswer{}, false
}
