package journal

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// CanonicalJSON re-encodes a JSON value with sorted object keys, no
// insignificant whitespace and no HTML escaping. Numbers keep their literal
// text, so integers beyond 2^53 survive unchanged. Two payloads of one event
// compare equal byte for byte exactly when they carry the same JSON.
func CanonicalJSON(raw []byte) ([]byte, error) {
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	return encodeCanonical(v)
}

// decodeJSON decodes exactly one JSON value, keeping numbers as json.Number.
func decodeJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
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
