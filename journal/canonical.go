package journal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// CanonicalJSON re-encodes a JSON value with sorted object keys, no
// insignificant whitespace and no HTML escaping. Numbers keep their literal
// text, so integers beyond 2^53 survive unchanged. Two payloads of one event
// compare equal byte for byte exactly when they carry the same JSON. A value
// with a repeated object key is refused: it has no single reading.
func CanonicalJSON(raw []byte) ([]byte, error) {
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	return encodeCanonical(v)
}

// errDuplicateKey marks a JSON object that names one key twice.
var errDuplicateKey = errors.New("duplicate key")

// errTooDeep marks a JSON value nested deeper than MaxJSONDepth.
var errTooDeep = fmt.Errorf("nested deeper than %d levels", MaxJSONDepth)

// decodeJSON decodes exactly one JSON value into maps, slices, strings,
// booleans, nil and json.Number (the literal text of a number). It is the
// one reading every rule, size check and canonical form is taken from, so
// it is strict where encoding/json is lenient: object keys are kept exactly
// as written (a struct decode would match "EVENT_ID" to event_id), and an
// object that repeats a key is refused instead of resolved one way here and
// another way there. A value nested deeper than MaxJSONDepth is refused
// too, before the decoder descends any further.
func decodeJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

// decodeValue reads the next value from dec, which must use numbers; depth
// is how many objects and arrays enclose it.
func decodeValue(dec *json.Decoder, depth int) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth == MaxJSONDepth {
			return nil, errTooDeep
		}
		switch t {
		case '{':
			obj := make(map[string]any)
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				key := kt.(string) // the decoder only yields string keys here
				if _, dup := obj[key]; dup {
					return nil, fmt.Errorf("%w %s", errDuplicateKey, strconv.Quote(key))
				}
				if obj[key], err = decodeValue(dec, depth+1); err != nil {
					return nil, err
				}
			}
			_, err := dec.Token() // '}'
			return obj, err
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token() // ']'
			return arr, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return tok, nil // string, json.Number, bool or nil
	}
}

func encodeCanonical(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // map keys are emitted sorted
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
