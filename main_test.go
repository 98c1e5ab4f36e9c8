package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runMain runs the command in-process with env as its environment.
func runMain(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, func(k string) string { return env[k] }, &out, &errb)
	return code, out.String(), errb.String()
}

// TestCommandLine: -version, -help, -check and bad flags answer as
// docs/command-line.md says, and -check describes what the process would
// run: the flags and environment that win over the file included.
func TestCommandLine(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "rategate.yaml")
	if err := os.WriteFile(cfgPath, []byte("redis: {url: redis://10.0.0.9:6379/0}\nrules: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		env      map[string]string
		args     []string
		code     int
		want     []string // in stdout (stderr for -help and errors)
		dontWant []string
	}{
		{name: "version", args: []string{"-version"}, code: exitOK, want: []string{"rategate ", "go1."}},
		{name: "help lists the admin client", args: []string{"-help"}, code: exitOK, want: []string{"rategate admin [flags] COMMAND", "-redis URL", "-check"}},
		{name: "check, built-in policy, memory store", args: []string{"-check"}, code: exitOK,
			want: []string{"source:        built-in example policy", "store:         in-memory"}},
		{name: "check names the store -redis gives", args: []string{"-check", "-redis", "redis://u:s3cret@127.0.0.1:6390/2"}, code: exitOK,
			want: []string{"store:         redis redis://u:xxxxx@127.0.0.1:6390/2"}, dontWant: []string{"in-memory", "s3cret"}},
		{name: "the environment's Redis wins over the file's", env: map[string]string{"RATEGATE_REDIS_URL": "redis://127.0.0.1:6391/0"},
			args: []string{"-check", "-config", cfgPath}, code: exitOK,
			want: []string{"store:         redis redis://127.0.0.1:6391/0"}, dontWant: []string{"10.0.0.9"}},
		{name: "the file's Redis otherwise", args: []string{"-check", "-config", cfgPath}, code: exitOK,
			want: []string{"store:         redis redis://10.0.0.9:6379/0"}},
		{name: "an admin listener from the flag", args: []string{"-check", "-admin-listen", "127.0.0.1:9999"}, code: exitOK,
			want: []string{"admin listen:  127.0.0.1:9999"}},
		{name: "unknown flag", args: []string{"-nope"}, code: exitInvalid, want: []string{"flag provided but not defined: -nope"}},
		{name: "stray argument", args: []string{"serve"}, code: exitInvalid, want: []string{`unexpected argument "serve"`}},
		{name: "missing config file", args: []string{"-check", "-config", filepath.Join(t.TempDir(), "absent.yaml")}, code: exitInvalid,
			want: []string{"absent.yaml"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runMain(t, tc.env, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, stdout, stderr)
			}
			text := stdout
			if tc.code != exitOK || tc.args[0] == "-help" {
				text = stderr
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("output lacks %q:\n%s", w, text)
				}
			}
			for _, w := range tc.dontWant {
				if strings.Contains(stdout+stderr, w) {
					t.Errorf("output has %q:\n%s%s", w, stdout, stderr)
				}
			}
		})
	}
}
