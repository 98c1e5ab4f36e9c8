package app

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
)

// TestAdminTokenSurroundingWhiteSpace: the admin API trims white space
// from the credential a client sends, but the token it compared it with
// was taken as given. A token that ends in a newline (a Kubernetes Secret
// made with --from-file from a file written by echo, a token file read
// into RATEGATE_ADMIN_TOKEN) was then matched by no request (a client
// cannot send a newline in a header, and one sent with a trailing space
// is trimmed): every admin call, scrapes included, was a 401 with
// nothing to say why, and the newline counted toward the 16 bytes an
// admin listener off loopback needs ("15 characters\n" passed, as did 16
// spaces). The token is the text between the white space, wherever it
// comes from.
func TestAdminTokenSurroundingWhiteSpace(t *testing.T) {
	const token = "0123456789abcdef0123"
	for _, c := range []struct{ name, env, file string }{
		{"env", token + "\n", ""},
		{"file", "", " " + token + "\t\n"},
	} {
		cfg := config.Example()
		cfg.Admin.Token = c.file
		a, err := New(cfg, Options{Log: zerolog.Nop(), AdminToken: c.env})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Close)
		h := serveOn(t, a.AdminHandler())
		if code, body := call(t, h, "GET", "/v1/rules", "", "Authorization", "Bearer "+token); code != 200 {
			t.Errorf("%s token %q, sent %q: %d %.200s, want 200", c.name, c.env+c.file, token, code, body)
		}
		if code, _ := call(t, h, "GET", "/v1/rules", ""); code != 401 {
			t.Errorf("%s token %q, none sent: %d, want 401", c.name, c.env+c.file, code)
		}
	}
	// What Run checks before it serves an admin listener off loopback.
	for _, tok := range []string{"012345678901234\n", "                ", " 0123456789abcd \n"} {
		a, err := New(config.Example(), Options{Log: zerolog.Nop(), AdminToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Close)
		if openAdminTokenProblem(a.config().Admin.Token) == "" {
			t.Errorf("token %q passes as a token of at least %d bytes off loopback", tok, MinOpenAdminToken)
		}
	}
}
