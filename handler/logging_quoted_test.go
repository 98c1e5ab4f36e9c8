package handler

import "testing"

// TestWithoutQuoted: what fasthttp quotes of a client's request (an invalid
// header value, the admin token perhaps) leaves the log of either listener.
func TestWithoutQuoted(t *testing.T) {
	for in, want := range map[string]string{
		`error when reading request headers: invalid header value "Bearer s3cr3t\x01": buffer size=96`: `error when reading request headers: invalid header value "…": buffer size=96`,
		`a "quoted \"inner\" part" and "another"`:                                                      `a "…" and "…"`,
		`nothing quoted`: `nothing quoted`,
		`cut "open`:      `cut "…"`,
	} {
		if got := withoutQuoted(in); got != want {
			t.Errorf("withoutQuoted(%q) = %q, want %q", in, got, want)
		}
	}
}
