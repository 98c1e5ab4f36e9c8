//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// appProxyPass is a proxy_pass to the application's upstream, as the
// shipped configs ("app") and the docs' snippets ("my_app") name it.
var appProxyPass = regexp.MustCompile(`\bproxy_pass\s+https?://(app|my_app)\b`)

// nginxFence is a fenced nginx code block of a Markdown file.
var nginxFence = regexp.MustCompile("(?s)```nginx\n(.*?)```")

// locationBlocks returns each "location ... { ... }" block of an NGINX
// config (comments removed), with the line it starts on.
func locationBlocks(conf string) (blocks []string, lines []int) {
	var b strings.Builder
	for _, l := range strings.Split(conf, "\n") {
		if i := strings.IndexByte(l, '#'); i >= 0 {
			l = l[:i]
		}
		b.WriteString(l + "\n")
	}
	s := b.String()
	loc := regexp.MustCompile(`(^|[\s;{}])location\s[^{;]*\{`)
	for _, m := range loc.FindAllStringIndex(s, -1) {
		depth, end := 0, len(s)
		for i := m[1] - 1; i < len(s); i++ {
			if s[i] == '{' {
				depth++
			} else if s[i] == '}' {
				depth--
				if depth == 0 {
					end = i + 1
					break
				}
			}
		}
		blocks = append(blocks, s[m[0]:end])
		lines = append(lines, strings.Count(s[:m[0]], "\n")+1)
	}
	return blocks, lines
}

// TestRewriteURLClearedInEveryShippedAppLocation: the shipped configs now
// clear a client's X-Original-URL and X-Rewrite-URL towards the
// application (TestClientRewriteURLHeaders), because some frameworks serve
// the path those name instead of the request line's, which is the one
// rategate counted. Every location the project ships that proxies to the
// application must do so, the NGINX configs in nginx/ and the snippets
// docs/*.md and the READMEs tell users to copy: a location with its own
// proxy_set_header lines inherits none from its server, so one location
// without them hands the application the client's path.
func TestRewriteURLClearedInEveryShippedAppLocation(t *testing.T) {
	type source struct{ file, text string }
	var sources []source
	confs, _ := filepath.Glob(filepath.Join(repoRoot, "nginx", "*.conf"))
	mds, _ := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	mds = append(mds, filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "nginx", "README.md"))
	for _, f := range confs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sources = append(sources, source{f, string(b)})
	}
	for _, f := range mds {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, m := range nginxFence.FindAllStringSubmatch(string(b), -1) {
			sources = append(sources, source{f + " (an nginx snippet)", m[1]})
		}
	}
	checked := 0 // locations that proxy to the application
	for _, src := range sources {
		blocks, lines := locationBlocks(src.text)
		for i, blk := range blocks {
			if !appProxyPass.MatchString(blk) {
				continue
			}
			checked++
			for _, h := range []string{"X-Original-URL", "X-Rewrite-URL"} {
				if !regexp.MustCompile(`(?i)proxy_set_header\s+` + h + `\s+""\s*;`).MatchString(blk) {
					rel, _ := filepath.Rel(repoRoot, src.file)
					t.Errorf("%s, line %d: a location that proxies to the application does not clear a client's %s:\n%s",
						rel, lines[i], h, blk)
				}
			}
		}
	}
	if checked < 7 {
		t.Fatalf("found %d locations that proxy to the application, want the six shipped configs' and the docs'", checked)
	}
}
