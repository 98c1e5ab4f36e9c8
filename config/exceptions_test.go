package config

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/rategate/rategate/limits"
)

// TestExceptionsCompile: exact identities become the identity the store
// key holds; ip ranges stay ranges; an IPv6 address names its client's
// network; numbers, exempt and block are kept as written.
func TestExceptionsCompile(t *testing.T) {
	c, err := Parse("x.yaml", []byte(`
identity: {ipv6_prefix: 56}
rules:
  - name: per-user
    key: [user]
    algorithm: gcra
    limit: 100
    period: 1m
    burst: 20
    exceptions:
      - match: {user: acme}
        limit: 1000
        reason: enterprise plan
      - match: {user: "a b|c"}
        factor: 0.5
      - match: {user: bot}
        block: true
  - name: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 10
    period: 1m
    exceptions:
      - match: {ip: 10.0.0.0/8}
        exempt: true
      - match: {ip: 192.0.2.7}
        limit: 50
      - match: {ip: "2001:db8:1:2:3::9"}
        exempt: true
      - match: {ip: "2001:db8:100::/40"}
        block: true
  - name: route-ip
    key: [route, ip, header:X-Plan]
    algorithm: fixed_window
    limit: 10
    period: 1m
    exceptions:
      - match: {route: /a/../health, ip: 10.0.0.0/8, "header:x-plan": gold}
        exempt: true
`))
	if err != nil {
		t.Fatal(err)
	}
	ex := c.Rules[0].Exceptions
	if len(ex) != 3 || ex[0].ID != "acme" || ex[0].Action != limits.IdentityLimit || ex[0].Limit != 1000 || ex[0].Reason != "enterprise plan" ||
		ex[1].ID != "a%20b%7Cc" || ex[1].Factor != 0.5 || ex[2].Action != limits.IdentityBlock {
		t.Fatalf("per-user exceptions: %+v", ex)
	}
	ip := c.Rules[1].Exceptions
	if ip[0].ID != "" || ip[0].Range != netip.MustParsePrefix("10.0.0.0/8") || ip[0].Action != limits.IdentityExempt {
		t.Fatalf("range: %+v", ip[0])
	}
	if ip[1].ID != "192.0.2.7" || ip[2].ID != "2001:db8:1::/56" || ip[3].Range != netip.MustParsePrefix("2001:db8:100::/40") {
		t.Fatalf("ips: %q %q %v", ip[1].ID, ip[2].ID, ip[3].Range)
	}
	if !reflect.DeepEqual(ip[2].Match, map[string]string{"ip": "2001:db8:1:2:3::9"}) {
		t.Fatalf("match as written: %v", ip[2].Match)
	}
	multi := c.Rules[2].Exceptions[0]
	if multi.IP != 1 || !reflect.DeepEqual(multi.Parts, []string{"/health", "", "gold"}) ||
		!reflect.DeepEqual(multi.Match, map[string]string{"route": "/a/../health", "ip": "10.0.0.0/8", "header.X-Plan": "gold"}) {
		t.Fatalf("multi-part range: %+v", multi)
	}
	d := c.Describe()
	for _, want := range []string{"exception:  user=acme: 1000 per 1m, burst 200 (enterprise plan)", "exception:  user=a b|c: 50 per 1m, burst 10",
		"exception:  user=bot: block", "exception:  ip=10.0.0.0/8: exempt", "overrides:     up to 100000 runtime identity overrides, all rules together"} {
		if !strings.Contains(d, want) {
			t.Errorf("-check lacks %q:\n%s", want, d)
		}
	}
}

// TestExceptionsInvalid: every problem names the rule, the exception and
// the field.
func TestExceptionsInvalid(t *testing.T) {
	const head = "rules:\n  - name: r\n    key: [user]\n    algorithm: sliding_log\n    limit: 10\n    period: 1m\n    exceptions:\n"
	const ipHead = "rules:\n  - name: r\n    key: [ip]\n    algorithm: gcra\n    limit: 10\n    period: 1m\n    exceptions:\n"
	for _, c := range []struct {
		name, yaml string
		want       []string
	}{
		{"not a list", head + "      match: {user: a}\n", []string{`rules[0] "r": line 8: exceptions must be a list of exceptions`}},
		{"item not a mapping", head + "      - acme\n", []string{`rules[0] "r": line 8: exceptions[0] must be a mapping`}},
		{"unknown key", head + "      - match: {user: a}\n        exmpt: true\n", []string{`rules[0] "r": line 9: unknown key "exmpt" in exceptions[0] (did you mean "exempt"?)`}},
		{"no match", head + "      - exempt: true\n", []string{`rules[0] "r": exceptions[0]: match must give every dimension of the rule's key; missing user`}},
		{"match not a mapping", head + "      - match: acme\n        exempt: true\n", []string{`rules[0] "r": line 8: exceptions[0].match must be a mapping of key dimensions to values`}},
		{"unknown dimension", head + "      - match: {user: a, ip: 10.0.0.1}\n        exempt: true\n",
			[]string{`rules[0] "r": exceptions[0]: match "ip" is not a dimension of the rule's key [user]`}},
		{"both", head + "      - match: {user: a}\n        exempt: true\n        block: true\n", []string{`rules[0] "r": exceptions[0]: exempt and block: give one of them, not both`}},
		{"limit with exempt", head + "      - match: {user: a}\n        exempt: true\n        limit: 5\n",
			[]string{`rules[0] "r": exceptions[0]: limit cannot go with exempt: give numbers, or exempt: true, or block: true`}},
		{"nothing to do", head + "      - match: {user: a}\n        reason: x\n", []string{`rules[0] "r": exceptions[0]: says nothing to do`}},
		{"limit zero", head + "      - match: {user: a}\n        limit: 0\n", []string{`rules[0] "r": exceptions[0]: limit must be >= 1, got 0`}},
		{"over the sliding_log cap", head + "      - match: {user: a}\n        factor: 2000\n",
			[]string{`rules[0] "r": exceptions[0]: factor must be > 0 and <= 1000, got 2000`}},
		{"derived over the cap", head + "      - match: {user: a}\n        limit: 20000\n",
			[]string{`rules[0] "r": exceptions[0]: limit must be <= 10000 for sliding_log, got 20000`}},
		{"burst on a window", head + "      - match: {user: a}\n        burst: 3\n",
			[]string{`rules[0] "r": exceptions[0]: burst is only for gcra and token_bucket, not sliding_log`}},
		{"factor not a number", head + "      - match: {user: a}\n        factor: lots\n", []string{`rules[0] "r": exceptions[0]: factor must be a number such as 1.5, got "lots"`}},
		{"duplicate", head + "      - match: {user: a}\n        exempt: true\n      - match: {user: a}\n        block: true\n",
			[]string{`rules[0] "r": exceptions[1]: names the same identity as exceptions[0]`}},
		{"exceptions with nothing under it", ipHead, []string{`rules[0] "r": exceptions: has nothing under it; write "exceptions: []" for none`}},
		{"range inside an earlier range", ipHead + "      - match: {ip: 10.0.0.0/8}\n        exempt: true\n      - match: {ip: 10.1.2.0/24}\n        block: true\n",
			[]string{`rules[0] "r": exceptions[1]: 10.1.2.0/24 lies inside exceptions[0]'s 10.0.0.0/8, which comes first and so always applies instead; put the narrower range first`}},
		{"ipv6 range inside an earlier range", ipHead + "      - match: {ip: \"2001:db8::/32\"}\n        limit: 5\n      - match: {ip: 10.0.0.0/8}\n        limit: 5\n      - match: {ip: \"2001:db8:7::/48\"}\n        block: true\n",
			[]string{`rules[0] "r": exceptions[2]: 2001:db8:7::/48 lies inside exceptions[0]'s 2001:db8::/32`}},
		{"empty user", head + "      - match: {user: \"\"}\n        exempt: true\n", []string{`rules[0] "r": exceptions[0]: match user is empty`}},
		{"user with a space no request has", head + "      - match: {user: \" spaced\"}\n        exempt: true\n",
			[]string{`rules[0] "r": exceptions[0]: match user " spaced" starts or ends with white space, which rategate trims from a header value: no request is this user`}},
		{"user with a control byte", head + "      - match: {user: \"a\\x01b\"}\n        exempt: true\n",
			[]string{`rules[0] "r": exceptions[0]: match user "a\x01b" holds the control byte 0x01`}},
		{"bad ip", ipHead + "      - match: {ip: 10.0.0.300}\n        exempt: true\n", []string{`rules[0] "r": exceptions[0]: match ip "10.0.0.300" is not an IP address or a CIDR range`}},
		{"ipv6 range narrower than a client", ipHead + "      - match: {ip: \"2001:db8::/96\"}\n        exempt: true\n",
			[]string{`rules[0] "r": exceptions[0]: match ip "2001:db8::/96" is narrower than one IPv6 client`}},
		{"global rule", "rules:\n  - name: r\n    algorithm: gcra\n    limit: 10\n    period: 1m\n    exceptions:\n      - match: {user: a}\n        exempt: true\n",
			[]string{`rules[0] "r": exceptions need a rule keyed on something`}},
		{"cost over the derived burst", "rules:\n  - name: r\n    key: [user]\n    algorithm: gcra\n    limit: 10\n    period: 1m\n    cost: 5\n    exceptions:\n      - match: {user: a}\n        burst: 2\n",
			[]string{`rules[0] "r": exceptions[0]: cost 5 is more than the burst (2)`}},
		{"cap out of range", "identity_overrides: {max_entries: 0}\n", []string{`identity_overrides.max_entries: must be >= 1, got 0`}},
	} {
		_, err := Parse("x.yaml", []byte(c.yaml))
		var errs Errors
		if !errors.As(err, &errs) {
			t.Errorf("%s: error %v, want Errors", c.name, err)
			continue
		}
		if len(errs) != len(c.want) {
			t.Errorf("%s: %d problems, want %d:\n%v", c.name, len(errs), len(c.want), err)
			continue
		}
		for i, w := range c.want {
			if !strings.HasPrefix(errs[i].Error(), "x.yaml: "+w) {
				t.Errorf("%s: problem %q, want it to start with %q", c.name, errs[i].Error(), "x.yaml: "+w)
			}
		}
	}
}

// TestIdentityOverridesCap: identity_overrides.max_entries is read.
func TestIdentityOverridesCap(t *testing.T) {
	c, err := Parse("x.yaml", []byte("identity_overrides: {max_entries: 5000}\n"))
	if err != nil || c.IdentityOverrides.MaxEntries != 5000 {
		t.Fatalf("%+v %v", c.IdentityOverrides, err)
	}
}
