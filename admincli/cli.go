// Package admincli is `rategate admin`: the command-line client of the
// admin API (rules, overrides, keys, top, reload).
package admincli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/policy"
	"github.com/rategate/rategate/top"
)

// CLI exit codes.
const (
	cliOK      = 0
	cliFailed  = 1 // the server said no, or could not be reached
	cliUsage   = 2
	defaultCLI = "127.0.0.1:9090"
)

const cliUsageText = `usage: rategate admin [-addr HOST:PORT] [-token TOKEN] [-config FILE] [-json] COMMAND [ARGS]

Commands:
  rules                                  the rules in force: file values, override, effective values, adaptive factor
  override RULE [limit=N] [period=D] [burst=N] [factor=F] [reason=TEXT] [ttl=D]
                                         change a rule at run time (every instance, within 1s)
  override RULE clear                    delete the override: the file's values apply again
  key RULE [ip=A] [user=U] [route=R] [method=M] [host=H] [header.NAME=V]
                                         one identity's state under RULE, without consuming
  reset RULE [ip=A] [user=U] ...         reset that identity ("unban")
  identity RULE user=U [limit=N] [period=D] [burst=N] [factor=F] [ttl=D] [reason=TEXT]
                                         one identity's own numbers under RULE (every instance, within 1s)
  identity RULE user=U exempt|block [ttl=D] [reason=TEXT]
                                         never limited by RULE / always denied by it
  identity RULE user=U [clear]           show what applies to it / delete its runtime override
  identity RULE list [n=N] [after=ID]    RULE's identity overrides and config exceptions
  top [RULE] [minutes=N] [n=N]           identities denied most in the last minutes
  reload                                 re-read the config file (like SIGHUP)

The admin address is -addr, else RATEGATE_ADMIN_ADDR, else admin.listen from
-config, else 127.0.0.1:9090. The token is -token, else RATEGATE_ADMIN_TOKEN,
else admin.token from -config.
Exit status: 0 done, 1 the server refused or could not be reached (its message
is printed), 2 usage error.
`

// Run runs `rategate admin ARGS` and returns the exit status.
func Run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rategate admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, cliUsageText) }
	addr := fs.String("addr", "", "admin listener `host:port`")
	token := fs.String("token", "", "admin `token`")
	cfgPath := fs.String("config", "", "read admin.listen and admin.token from this config `file`")
	asJSON := fs.Bool("json", false, "print the server's JSON instead of a table")
	timeout := fs.Duration("timeout", 10*time.Second, "request timeout")
	// Flags may come before or after the command and its arguments
	// ("rategate admin rules -json"): parse, take one positional, repeat.
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return cliOK
			}
			return cliUsage
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(pos) == 0 {
		fs.Usage()
		return cliUsage
	}
	a, t := *addr, *token
	if a == "" {
		a = getenv("RATEGATE_ADMIN_ADDR")
	}
	if t == "" {
		t = getenv("RATEGATE_ADMIN_TOKEN")
	}
	if *cfgPath != "" && (a == "" || t == "") {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return cliUsage
		}
		if a == "" {
			a = cfg.Admin.Listen
		}
		if t == "" {
			t = cfg.Admin.Token
		}
	}
	if a == "" {
		a = defaultCLI
	}
	// As the server takes it: a token file's newline is not part of it.
	t = strings.TrimSpace(t)
	c := &client{base: "http://" + dialable(a), token: t, json: *asJSON, out: stdout, errOut: stderr,
		http: &http.Client{Timeout: *timeout}}
	cmd, rest := pos[0], pos[1:]
	switch cmd {
	case "rules":
		return c.rules(rest)
	case "override":
		return c.override(rest)
	case "key", "keys", "inspect":
		return c.key(rest, http.MethodGet)
	case "reset":
		return c.key(rest, http.MethodDelete)
	case "top":
		return c.top(rest)
	case "identity", "identities":
		return c.identity(rest)
	case "reload":
		return c.reload(rest)
	case "help":
		fmt.Fprint(stdout, cliUsageText)
		return cliOK
	}
	fmt.Fprintf(stderr, "rategate admin: unknown command %q\n\n%s", cmd, cliUsageText)
	return cliUsage
}

// dialable turns a listen address (":9090", "0.0.0.0:9090") into one to dial.
func dialable(a string) string {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return a
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

type client struct {
	base, token string
	json        bool
	out, errOut io.Writer
	http        *http.Client
}

// call sends one request. On an error answer it prints the server's message
// (and its list of problems) to stderr and returns false.
func (c *client) call(method, path string, query url.Values, body []byte, into any, accept ...int) bool {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		fmt.Fprintln(c.errOut, "rategate admin:", err)
		return false
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		fmt.Fprintf(c.errOut, "rategate admin: %v\n(is rategate running with its admin listener at %s? set -addr)\n", err, strings.TrimPrefix(c.base, "http://"))
		return false
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		fmt.Fprintln(c.errOut, "rategate admin: read answer:", err)
		return false
	}
	if resp.StatusCode >= 300 && !slices.Contains(accept, resp.StatusCode) {
		var e admin.APIError
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			fmt.Fprintf(c.errOut, "rategate admin: %s (%s)\n", e.Error, resp.Status)
			for _, d := range e.Errors {
				fmt.Fprintln(c.errOut, "  "+d)
			}
		} else {
			fmt.Fprintf(c.errOut, "rategate admin: %s: %s\n", resp.Status, strings.TrimSpace(string(data)))
		}
		return false
	}
	if c.json {
		c.out.Write(data)
		return true
	}
	if into != nil {
		if err := json.Unmarshal(data, into); err != nil {
			fmt.Fprintln(c.errOut, "rategate admin: unexpected answer:", err)
			return false
		}
	}
	return true
}

func status(ok bool) int {
	if ok {
		return cliOK
	}
	return cliFailed
}

func (c *client) usage(msg string) int {
	fmt.Fprintf(c.errOut, "rategate admin: %s\n\n%s", msg, cliUsageText)
	return cliUsage
}

func (c *client) rules(args []string) int {
	if len(args) > 0 {
		return c.usage("rules takes no arguments")
	}
	var v policy.RulesView
	if !c.call(http.MethodGet, "/v1/rules", nil, nil, &v) {
		return cliFailed
	}
	if c.json {
		return cliOK
	}
	scope := "in Redis (every instance)"
	if !v.OverridesShared {
		scope = "in this process (memory store)"
	}
	fmt.Fprintf(c.out, "source: %s (loaded %s); overrides kept %s\n\n", v.Source, v.LoadedAt.Local().Format(time.RFC3339), scope)
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	anyAdaptive := slices.ContainsFunc(v.Rules, func(r policy.RuleView) bool { return r.Adaptive != nil })
	head := "RULE\tALGORITHM\tKEY\tFILE\tOVERRIDE\tEFFECTIVE\tSHADOW"
	if anyAdaptive {
		head += "\tADAPTIVE"
	}
	fmt.Fprintln(tw, head)
	for _, r := range v.Rules {
		key := strings.Join(r.Key, ",")
		if key == "" {
			key = "(global)"
		}
		ov := "-"
		if r.Override != nil {
			ov = describeOverride(r.Override)
		}
		if r.OverrideError != "" {
			ov += " [" + r.OverrideError + "]"
		}
		row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", r.Name, r.Algorithm, key,
			describeValues(r.File, r.Algorithm), ov, describeValues(r.Effective, r.Algorithm), yesNo(r.Shadow))
		if anyAdaptive {
			row += "\t" + describeAdaptive(r.Adaptive)
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
	if len(v.Orphans) > 0 {
		names := make([]string, 0, len(v.Orphans))
		for n := range v.Orphans {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(c.out, "\noverrides for rules not in the file (kept; applied if the rule returns): %s\n", strings.Join(names, ", "))
	}
	return cliOK
}

// describeAdaptive is a rule's ADAPTIVE cell: the factor, the signal it
// was decided from, the instance that decided it, and why it is not in
// force when it is not: "x1.5 signal=42 by web-1-...-3fa2 (this instance)".
func describeAdaptive(a *policy.AdaptiveView) string {
	if a == nil {
		return "-"
	}
	parts := []string{"x" + strconv.FormatFloat(a.Factor, 'g', -1, 64)}
	if a.Signal != nil {
		parts = append(parts, "signal="+strconv.FormatFloat(*a.Signal, 'g', 6, 64))
	}
	if a.SetBy != "" {
		by := "by " + a.SetBy
		if a.Leader {
			by += " (this instance)"
		}
		parts = append(parts, by)
	}
	if a.Error != "" {
		since := ""
		if a.FailingSince != nil {
			since = " since " + a.FailingSince.Local().Format("15:04:05")
		}
		parts = append(parts, "[signal failing"+since+": "+a.Error+"]")
	}
	if !a.Applied && a.NotApplied != "" {
		parts = append(parts, "[not applied: "+a.NotApplied+"]")
	}
	return strings.Join(parts, " ")
}

func describeValues(v policy.Values, alg string) string {
	s := fmt.Sprintf("%d/%s", v.Limit, config.FormatDuration(time.Duration(v.Period)))
	if alg == "gcra" || alg == "token_bucket" {
		s += fmt.Sprintf(" burst %d", v.Burst)
	}
	return s
}

func describeOverride(o *policy.Override) string {
	var parts []string
	if o.Limit > 0 {
		parts = append(parts, fmt.Sprintf("limit=%d", o.Limit))
	}
	if o.Period > 0 {
		parts = append(parts, "period="+config.FormatDuration(time.Duration(o.Period)))
	}
	if o.Burst > 0 {
		parts = append(parts, fmt.Sprintf("burst=%d", o.Burst))
	}
	if o.Factor > 0 {
		parts = append(parts, "factor="+strconv.FormatFloat(o.Factor, 'g', -1, 64))
	}
	if o.ExpiresAt != nil {
		parts = append(parts, "until "+o.ExpiresAt.Local().Format("15:04:05"))
	}
	if o.Reason != "" {
		parts = append(parts, strconv.Quote(o.Reason))
	}
	return strings.Join(parts, " ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// keyValues splits name=value arguments.
func keyValues(args []string) (map[string]string, []string, error) {
	kv := map[string]string{}
	var order []string
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, nil, fmt.Errorf("argument %q is not name=value", a)
		}
		if _, dup := kv[k]; dup {
			return nil, nil, fmt.Errorf("%s given twice", k)
		}
		kv[k] = v
		order = append(order, k)
	}
	return kv, order, nil
}

func (c *client) override(args []string) int {
	if len(args) < 2 {
		return c.usage("override needs a rule and at least one of limit=, period=, burst=, factor=, or clear")
	}
	rule := args[0]
	path := "/v1/rules/" + url.PathEscape(rule) + "/override"
	if len(args) == 2 && (args[1] == "clear" || args[1] == "delete" || args[1] == "-clear") {
		var rv policy.RuleView
		if !c.call(http.MethodDelete, path, nil, nil, &rv) {
			return cliFailed
		}
		if !c.json {
			fmt.Fprintf(c.out, "override of %s deleted; in force: %s\n", rule, describeValues(rv.Effective, rv.Algorithm))
		}
		return cliOK
	}
	kv, order, err := keyValues(args[1:])
	if err != nil {
		return c.usage(err.Error())
	}
	body := map[string]json.RawMessage{}
	for _, k := range order {
		v := kv[k]
		switch k {
		case "limit", "burst", "factor":
			// Numbers go as numbers; anything else as a string, for the
			// server to reject with the field's name.
			if _, err := strconv.ParseFloat(v, 64); err == nil {
				body[k] = json.RawMessage(v)
				continue
			}
		}
		b, _ := json.Marshal(v)
		body[k] = b
	}
	b, _ := json.Marshal(body)
	var rv policy.RuleView
	if !c.call(http.MethodPut, path, nil, b, &rv) {
		return cliFailed
	}
	if !c.json {
		fmt.Fprintf(c.out, "override of %s set: %s; in force: %s (file: %s)\n", rule, describeOverride(rv.Override),
			describeValues(rv.Effective, rv.Algorithm), describeValues(rv.File, rv.Algorithm))
	}
	return cliOK
}

func (c *client) key(args []string, method string) int {
	if len(args) < 1 {
		return c.usage("give a rule and the identity: key RULE ip=203.0.113.7 user=alice")
	}
	kv, _, err := keyValues(args[1:])
	if err != nil {
		return c.usage(err.Error())
	}
	q := url.Values{}
	for k, v := range kv {
		q.Set(k, v)
	}
	var v admin.KeyView
	if !c.call(method, "/v1/keys/"+url.PathEscape(args[0]), q, nil, &v) {
		return cliFailed
	}
	if c.json {
		return cliOK
	}
	if v.Reset {
		fmt.Fprintf(c.out, "reset %s; the identity has its full quota again\n", v.Key)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "rule\t%s (%s)\n", v.Rule, v.Algorithm)
	fmt.Fprintf(tw, "key\t%s\n", v.Key)
	lim := fmt.Sprintf("%d per %s", v.Limit, config.FormatDuration(time.Duration(v.Period)))
	if v.Algorithm == "gcra" || v.Algorithm == "token_bucket" {
		lim += fmt.Sprintf(", burst %d", v.Burst)
	}
	fmt.Fprintf(tw, "limit\t%s\n", lim)
	if v.IdentityOverride != nil {
		fmt.Fprintf(tw, "identity override\t%s\n", describeIdentity(v.IdentityOverride))
	}
	fmt.Fprintf(tw, "remaining\t%d\n", v.Remaining)
	fmt.Fprintf(tw, "full again in\t%ds\n", v.ResetSeconds)
	switch {
	case v.Raw != nil:
		fmt.Fprintf(tw, "raw\t%s\n", describeRaw(v.Raw))
	case v.RawError != "":
		fmt.Fprintf(tw, "raw\t(%s)\n", v.RawError)
	}
	if l := v.Lease; l != nil {
		fmt.Fprintf(tw, "leased here\t%s\n", describeHeld(&l.Held))
		switch {
		case l.Store != nil:
			fmt.Fprintf(tw, "leased in all\t%d units in %d slices%s\n", l.Store.Units, len(l.Store.Slices), describeSlices(l.Store.Slices))
		case l.StoreError != "":
			fmt.Fprintf(tw, "leased in all\t(%s)\n", l.StoreError)
		}
	}
	tw.Flush()
	return cliOK
}

// describeHeld says what this instance holds of a leased key.
func describeHeld(h *limits.LeaseHeld) string {
	s := fmt.Sprintf("%d units to spend, %d slices%s, spending %.0f/s (instance %s)",
		h.Units, len(h.Slices), describeSlices(h.Slices), h.RatePerSecond, h.Instance)
	if h.DeniedForMS > 0 {
		s += fmt.Sprintf("; nothing left to lease: denied here for %dms more", h.DeniedForMS)
	}
	return s
}

func describeSlices(ss []limits.SliceView) string {
	parts := make([]string, 0, len(ss))
	for _, s := range ss {
		parts = append(parts, fmt.Sprintf("%s: %d, ends in %dms", s.ID, s.Granted, s.EndsInMS))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

func describeRaw(r *limits.RawValue) string {
	ttl := ""
	switch {
	case r.TTLMS >= 0:
		ttl = fmt.Sprintf(" (expires in %dms)", r.TTLMS)
	case r.TTLMS == -1:
		ttl = " (no expiry)"
	}
	switch r.Type {
	case "none":
		return "none (no stored state: full quota)"
	case "hash":
		return "hash " + limits.JoinPairs(r.Hash, " ") + ttl
	case "string":
		if r.Record != nil {
			return "record " + limits.JoinPairs(r.Record, " ") + ttl
		}
	case "zset":
		parts := make([]string, 0, min(len(r.ZSet), 5))
		for i, m := range r.ZSet {
			if i == 5 {
				parts = append(parts, "...")
				break
			}
			parts = append(parts, m.Member)
		}
		return fmt.Sprintf("zset of %d: %s%s", len(r.ZSet), strings.Join(parts, " "), ttl)
	}
	return r.Type + " " + strconv.Quote(r.String) + ttl
}

func (c *client) top(args []string) int {
	q := url.Values{}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			switch k {
			case "minutes", "n", "rule":
				q.Set(k, v)
				continue
			}
			return c.usage(fmt.Sprintf("top: unknown argument %q (want RULE, minutes=N, n=N)", a))
		}
		if q.Has("rule") {
			return c.usage("top takes one rule")
		}
		q.Set("rule", a)
	}
	var v top.TopView
	if !c.call(http.MethodGet, "/v1/top", q, nil, &v) {
		return cliFailed
	}
	if c.json {
		return cliOK
	}
	scope := fmt.Sprintf("all %d instances", v.Instances)
	if v.Scope == "instance" {
		scope = "this instance"
	}
	fmt.Fprintf(c.out, "identities denied most in the last %d minute(s), %s\n\n", v.Minutes, scope)
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tIDENTITY\tDENIED\tMAX ERROR")
	rows := 0
	for _, l := range v.Rules {
		for _, d := range l.Top {
			id := d.Identity
			if d.Blocked {
				id += " (blocked)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", l.Rule, id, d.Denied, d.MaxError)
			rows++
		}
	}
	tw.Flush()
	if rows == 0 {
		fmt.Fprintln(c.out, "(no denials)")
	}
	return cliOK
}

func (c *client) reload(args []string) int {
	if len(args) > 0 {
		return c.usage("reload takes no arguments")
	}
	var res admin.ReloadResult
	// 409 is a partial reload: applied, but some changes need a restart.
	if !c.call(http.MethodPost, "/v1/reload", nil, nil, &res, http.StatusConflict) {
		return cliFailed
	}
	if !c.json {
		fmt.Fprintf(c.out, "reloaded %s: %d rules", res.Source, res.Rules)
		for _, p := range []struct {
			what  string
			names []string
		}{{"added", res.Added}, {"removed", res.Removed}, {"changed", res.Changed}, {"applied", res.Applied}} {
			if len(p.names) > 0 {
				fmt.Fprintf(c.out, "; %s: %s", p.what, strings.Join(p.names, ", "))
			}
		}
		fmt.Fprintln(c.out)
	}
	if len(res.NeedRestart) > 0 {
		fmt.Fprintln(c.errOut, "rategate admin: these changes were NOT applied; they take a restart:")
		for _, f := range res.NeedRestart {
			fmt.Fprintln(c.errOut, "  "+f)
		}
		return cliFailed
	}
	return cliOK
}
