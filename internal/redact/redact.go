// Package redact hides the secrets a URL may carry before it is shown in
// -check's output, logs or the admin API.
package redact

import (
	"net/url"
	"strings"
)

// hidden replaces a secret.
const hidden = "xxxxx"

// secretWords mark a query parameter whose value is a secret: go-redis
// takes a Sentinel URL's password as ?password=, and an endpoint may take a
// token or key in its query.
var secretWords = []string{"pass", "secret", "token", "key", "auth"}

// URL returns raw with the password of its user info and the values of
// its secret-looking query parameters (a name holding pass, secret, token,
// key or auth, in any case) replaced, or "(unparsable URL)".
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.RawQuery != "" {
		q := u.Query()
		changed := false
		for name, vs := range q {
			if !secret(name) {
				continue
			}
			for i := range vs {
				vs[i] = hidden
			}
			changed = true
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	return u.Redacted()
}

func secret(name string) bool {
	name = strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}
