package admincli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/policy"
)

// identityBodyKeys are the name=value arguments of `identity` that go into
// the body; every other name=value is a dimension of the identity.
var identityBodyKeys = map[string]bool{"limit": true, "period": true, "burst": true, "factor": true, "reason": true, "ttl": true}

// identity is `rategate admin identity RULE ...`:
//
//	identity RULE user=acme limit=1000 ttl=30d reason=...   set its own numbers
//	identity RULE user=acme exempt [ttl=D] [reason=...]      never limited by RULE
//	identity RULE ip=203.0.113.7 block ttl=1h                 always denied by RULE
//	identity RULE user=acme clear                             delete the runtime override
//	identity RULE user=acme                                   show what applies
//	identity RULE list [n=N] [after=ID]                       list RULE's overrides
func (c *client) identity(args []string) int {
	if len(args) < 2 {
		return c.usage("identity needs a rule and an identity (user=acme) with limit=, exempt, block or clear; or: identity RULE list")
	}
	rule := args[0]
	path := "/v1/rules/" + url.PathEscape(rule) + "/identities"
	q := url.Values{}
	body := map[string]json.RawMessage{}
	var action string
	for _, a := range args[1:] {
		switch a {
		case "exempt", "block", "clear", "list":
			if action != "" {
				return c.usage(fmt.Sprintf("identity: give one of exempt, block, clear, list (got %s and %s)", action, a))
			}
			action = a
			continue
		}
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return c.usage(fmt.Sprintf("identity: argument %q is not name=value, exempt, block, clear or list", a))
		}
		if !identityBodyKeys[k] {
			if action == "list" || (k == "n" || k == "after") {
				q.Set(k, v)
				continue
			}
			if q.Has(k) {
				return c.usage(k + " given twice")
			}
			q.Set(k, v)
			continue
		}
		if _, dup := body[k]; dup {
			return c.usage(k + " given twice")
		}
		switch k {
		case "limit", "burst", "factor":
			if _, err := strconv.ParseFloat(v, 64); err == nil {
				body[k] = json.RawMessage(v)
				continue
			}
		}
		b, _ := json.Marshal(v)
		body[k] = b
	}
	switch action {
	case "list":
		if len(body) > 0 {
			return c.usage("identity RULE list takes n= and after=, nothing else")
		}
		return c.identityList(path, q)
	case "clear":
		if len(body) > 0 {
			return c.usage("identity ... clear takes only the identity")
		}
		var res struct {
			Deleted bool                 `json:"deleted"`
			Now     *policy.IdentityView `json:"now"`
		}
		if !c.call(http.MethodDelete, path, q, nil, &res) {
			return cliFailed
		}
		if !c.json {
			now := "the rule's own numbers apply"
			if res.Now != nil {
				now = "now: " + describeIdentity(res.Now)
			}
			fmt.Fprintf(c.out, "identity override of %s under %s deleted; %s\n", describeQuery(q), rule, now)
		}
		return cliOK
	case "exempt", "block":
		body[action] = json.RawMessage("true")
	case "":
		if len(body) == 0 {
			var v policy.IdentityView
			if !c.call(http.MethodGet, path, q, nil, &v) {
				return cliFailed
			}
			if !c.json {
				fmt.Fprintf(c.out, "%s under %s: %s\n", describeQuery(q), rule, describeIdentity(&v))
			}
			return cliOK
		}
	}
	b, _ := json.Marshal(body)
	var v policy.IdentityView
	if !c.call(http.MethodPut, path, q, b, &v) {
		return cliFailed
	}
	if !c.json {
		fmt.Fprintf(c.out, "identity override of %s under %s set: %s\n", describeQuery(q), rule, describeIdentity(&v))
	}
	return cliOK
}

// identityList prints a rule's identity overrides as a table.
func (c *client) identityList(path string, q url.Values) int {
	var l policy.IdentityList
	if !c.call(http.MethodGet, path, q, nil, &l) {
		return cliFailed
	}
	if c.json {
		return cliOK
	}
	scope := "in Redis (every instance)"
	if !l.Shared {
		scope = "in this process (memory store)"
	}
	fmt.Fprintf(c.out, "rule %s: %d runtime overrides kept %s (at most %d in all), %d config exceptions\n\n", l.Rule, l.Runtime, scope, l.Max, l.Config)
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IDENTITY\tSOURCE\tACTION\tIN FORCE\tUNTIL\tSET BY\tREASON")
	for i := range l.Identities {
		v := &l.Identities[i]
		until := "-"
		if v.ExpiresAt != nil {
			until = v.ExpiresAt.Local().Format(time.RFC3339)
		}
		by := v.SetBy
		if by == "" {
			by = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", limits.JoinPairs(v.Identity, " "), v.Source, v.Action, inForce(v), until, by, v.Reason)
	}
	tw.Flush()
	if len(l.Identities) == 0 {
		fmt.Fprintln(c.out, "(none)")
	}
	if l.Next != "" {
		fmt.Fprintf(c.out, "\nmore: rategate admin identity %s list after=%s\n", l.Rule, l.Next)
	}
	return cliOK
}

// inForce says what an override does: its numbers, exempt, blocked, or why not applied.
func inForce(v *policy.IdentityView) string {
	switch {
	case v.Error != "":
		return "not applied: " + v.Error
	case v.Action == "limit" && v.Effective != nil:
		e := v.Effective
		s := fmt.Sprintf("%d/%s", e.Limit, config.FormatDuration(time.Duration(e.Period)))
		if e.Burst != e.Limit {
			s += fmt.Sprintf(" burst %d", e.Burst)
		}
		return s
	case v.Action == "block":
		return "blocked"
	}
	return v.Action
}

// describeIdentity is one override in a sentence.
func describeIdentity(v *policy.IdentityView) string {
	var parts []string
	parts = append(parts, inForce(v))
	if v.Source == "config" {
		parts = append(parts, "(config file)")
	}
	if v.ExpiresAt != nil {
		parts = append(parts, "until "+v.ExpiresAt.Local().Format(time.RFC3339))
	}
	if v.Reason != "" {
		parts = append(parts, strconv.Quote(v.Reason))
	}
	if v.SetBy != "" {
		parts = append(parts, "set by "+v.SetBy)
	}
	if v.Hides != nil {
		parts = append(parts, "(hides the config exception: "+inForce(v.Hides)+")")
	}
	return strings.Join(parts, " ")
}

// describeQuery writes an identity as "user=acme ip=...".
func describeQuery(q url.Values) string {
	m := map[string]string{}
	for k := range q {
		m[k] = q.Get(k)
	}
	return limits.JoinPairs(m, " ")
}
