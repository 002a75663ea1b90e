package journal_test

import (
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

func TestCanonicalJSON(t *testing.T) {
	for _, c := range []struct {
		name, in, want string
	}{
		{"SortsKeys", `{"b":1,"a":2,"c":{"z":1,"y":2}}`, `{"a":2,"b":1,"c":{"y":2,"z":1}}`},
		{"DropsWhitespace", " { \"a\" : [ 1 , 2 ] ,\n\t\"b\" : null } ", `{"a":[1,2],"b":null}`},
		{"KeepsHTMLUnescaped", `{"body":"<b>a & b</b>"}`, `{"body":"<b>a & b</b>"}`},
		{"UnescapesHTMLEscapes", `{"body":"\u003cb\u003e \u0026"}`, `{"body":"<b> &"}`},
		{"KeepsBigIntegers", `{"n":123456789012345678901234567890,"m":-9007199254740993}`, `{"m":-9007199254740993,"n":123456789012345678901234567890}`},
		{"KeepsNumberLiterals", `{"f":1.50,"e":1e3}`, `{"e":1e3,"f":1.50}`},
		{"KeepsArrayOrder", `[3,1,2]`, `[3,1,2]`},
		{"KeepsUnicode", `{"a":"héllo \u263a"}`, `{"a":"héllo ☺"}`},
		{"EscapesControlCharacters", `{"a":"line\nbreak \"quoted\""}`, `{"a":"line\nbreak \"quoted\""}`},
		{"KeepsScalars", `"text"`, `"text"`},
		{"KeysDifferingOnlyInCaseAreDistinct", `{"msgtype":"m.text","MSGTYPE":"m.notice"}`, `{"MSGTYPE":"m.notice","msgtype":"m.text"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := journal.CanonicalJSON([]byte(c.in))
			if err != nil {
				t.Fatalf("CanonicalJSON(%s): %v", c.in, err)
			}
			if string(got) != c.want {
				t.Fatalf("CanonicalJSON(%s) = %s, want %s", c.in, got, c.want)
			}
			// Canonical form is a fixed point.
			again, err := journal.CanonicalJSON(got)
			if err != nil || string(again) != c.want {
				t.Fatalf("CanonicalJSON is not idempotent: %s, %v", again, err)
			}
		})
	}
}

func TestCanonicalJSONRejects(t *testing.T) {
	for _, c := range []struct{ name, in string }{
		{"Empty", ``},
		{"TrailingGarbage", `{"a":1} x`},
		{"TwoValues", `{"a":1}{"b":2}`},
		{"Truncated", `{"a":`},
		{"BareWord", `hello`},
		{"SingleQuotes", `{'a':1}`},
		{"TrailingComma", `{"a":1,}`},
		// A repeated key has no single reading: refused, not resolved.
		{"DuplicateKey", `{"a":1,"a":2}`},
		{"DuplicateKeyNested", `{"a":{"b":1,"c":[{"d":1,"d":1}]}}`},
		{"DuplicateKeyEvenWhenEqual", `{"a":1,"a":1}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, err := journal.CanonicalJSON([]byte(c.in)); err == nil {
				t.Fatalf("CanonicalJSON(%q) = %s, want an error", c.in, got)
			}
		})
	}
}
