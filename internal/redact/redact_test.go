package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"redis://u:s3cret@h:6379/0", "redis://u:xxxxx@h:6379/0"},
		// go-redis's Sentinel URL: the servers' password in the query
		{"redis://su:sp@10.0.0.1:26379?addr=10.0.0.2:26379&master_name=mymaster&password=s3cret",
			"redis://su:xxxxx@10.0.0.1:26379?addr=10.0.0.2%3A26379&master_name=mymaster&password=xxxxx"},
		{"redis://h:26379?master_name=m&PASSWORD=s3cret&sentinel_password=s3cret", "redis://h:26379?PASSWORD=xxxxx&master_name=m&sentinel_password=xxxxx"},
		{"https://metrics.example/api?access_token=s3cret&x=1", "https://metrics.example/api?access_token=xxxxx&x=1"},
		{"http://h/load?apiKey=s3cret&auth=s3cret", "http://h/load?apiKey=xxxxx&auth=xxxxx"},
		{"http://h/load?q=a+b&z=1", "http://h/load?q=a+b&z=1"},
		{"redis://u:s3cret@h:6379/%zz", "(unparsable URL)"},
	} {
		got := URL(c.in)
		if got != c.want {
			t.Errorf("URL(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.Contains(got, "s3cret") {
			t.Errorf("URL(%q) shows the secret: %q", c.in, got)
		}
	}
}
