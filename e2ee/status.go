package e2ee

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/mindroomd/mindroomd/atomicfile"
)

// DeviceStatus is what an operator sees of an agent's device: the daemon
// writes it at start, `mindroomd status` reads it.
type DeviceStatus struct {
	DeviceID    string `json:"device_id"`
	CrossSigned bool   `json:"cross_signed"`
	// Reason says, when the device is not cross-signed, what is missing.
	Reason string `json:"reason,omitempty"`
	// CheckedMS is when the daemon last checked, in unix milliseconds.
	CheckedMS int64 `json:"checked_ms"`
}

// deviceStatusPath is <storage>/matrix/<agent>.device.json, beside the
// agent's session file.
func deviceStatusPath(storageDir, agent string) string {
	return filepath.Join(storageDir, "matrix", agent+".device.json")
}

// WriteDeviceStatus records an agent's device status.
func WriteDeviceStatus(storageDir, agent string, s DeviceStatus) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode device status: %w", err)
	}
	if err := atomicfile.Write(deviceStatusPath(storageDir, agent), append(data, '\n')); err != nil {
		return fmt.Errorf("device status: %w", err)
	}
	return nil
}

// ReadDeviceStatus reads an agent's device status; ok is false when the
// daemon has not written one yet.
func ReadDeviceStatus(storageDir, agent string) (s DeviceStatus, ok bool, err error) {
	data, err := os.ReadFile(deviceStatusPath(storageDir, agent))
	if errors.Is(err, fs.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("read device status: %w", err)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, false, fmt.Errorf("device status of %s is damaged: %w", agent, err)
	}
	return s, true, nil
}
