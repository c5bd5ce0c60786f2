package lease

// Exports for sibling domain packages (internal/fence) that keep their own
// subtrees under the same key prefix and need the same name escaping.

// EscapeName maps a name to a key segment without '/', exactly as lock names
// are mapped: injective and prefix-preserving (see escape).
func EscapeName(name string) string { return escape(name) }

// UnescapeName inverts EscapeName.
func UnescapeName(seg string) string { return unescape(seg) }

// EncodePageToken makes an escaped name an opaque List-style cursor.
func EncodePageToken(escName string) string { return encodePageToken(escName) }

// DecodePageToken reads a cursor made by EncodePageToken; a *FieldError for
// page_token if it is not one.
func DecodePageToken(tok string) (string, error) { return decodePageToken(tok) }

// FieldErr returns a *FieldError for field.
func FieldErr(field, format string, args ...any) error { return fieldErr(field, format, args...) }
