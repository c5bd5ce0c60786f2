package keyspace

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Limits on names and owners.
const (
	MaxNameLen  = 512
	MaxOwnerLen = 256
)

// FieldError is bad input: Field names the request field, Reason says what
// is wrong with it. Nothing is written to etcd when it is returned.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// FieldErr returns a *FieldError for field, its reason formatted.
func FieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ValidateName checks a lock or resource name (or, with allowEmpty, a name
// prefix) and returns a *FieldError for field if it is not acceptable.
func ValidateName(field, name string, allowEmpty bool) error {
	switch {
	case name == "" && !allowEmpty:
		return FieldErr(field, "must not be empty")
	case len(name) > MaxNameLen:
		return FieldErr(field, "is %d bytes long; at most %d are allowed", len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return FieldErr(field, "must be valid UTF-8")
	}
	return noControlCharacters(field, name)
}

// ValidateOwner checks an owner description (of a lock or a session): free
// text, shown by Describe, List and coordctl, so it obeys the rules of
// names, except that it may be empty.
func ValidateOwner(owner string) error {
	switch {
	case len(owner) > MaxOwnerLen:
		return FieldErr("owner", "is %d bytes long; at most %d are allowed", len(owner), MaxOwnerLen)
	case !utf8.ValidString(owner):
		return FieldErr("owner", "must be valid UTF-8")
	}
	return noControlCharacters("owner", owner)
}

// ValidateToken checks a fencing token argument.
func ValidateToken(token int64) error {
	if token <= 0 {
		return FieldErr("token", "must be a positive fencing token as returned by Acquire, got %d", token)
	}
	return nil
}

// noControlCharacters refuses the characters that forge rows, run terminal
// escapes or hide text when a value is printed in a terminal or a log line:
// C0 and C1 controls (U+0000..U+001F, U+007F..U+009F; U+009B is CSI on
// many terminals) and the bidi controls that reorder what is shown
// (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069).
func noControlCharacters(field, s string) error {
	for i, r := range s {
		if unicode.IsControl(r) || isBidiControl(r) {
			return FieldErr(field, "contains control character %U at byte %d; use printable text", r, i)
		}
	}
	return nil
}

func isBidiControl(r rune) bool {
	switch {
	case r == 0x061c, r == 0x200e, r == 0x200f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}
