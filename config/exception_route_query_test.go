package config

import "testing"

// TestExceptionRouteQueryNotWholeRoute: an exception's route is
// normalized as /auth normalizes a request, which drops the query, so
// {route: "/status?probe=lb"} compiles to the route /status: every
// request of /status, whatever its query, gets it. Through the real /auth
// (app stack) an exemption written for "/status?probe=lb" admitted 6 of 6
// requests of /status?x=1 from any address at a limit of 3 per hour. No
// request's route holds a query, so such an exception can never mean what
// it says; match.path refuses the same spelling ("/a?x" is not a
// normalized route; write "/a"). Refuse it, or keep it off /status.
func TestExceptionRouteQueryNotWholeRoute(t *testing.T) {
	for _, route := range []string{"/status?probe=lb", "/status#lb"} {
		id, ok := exceptionNaming(t, `
rules:
  - name: byr
    key: [route]
    algorithm: fixed_window
    limit: 3
    period: 1h
    exceptions:
      - match: {route: "`+route+`"}
        exempt: true
`)
		if ok && id == "/status" {
			t.Errorf("exception {route: %q} exempt was accepted and names %q: every request of /status, any query, is exempt "+
				"(want the file refused: no route /auth counts holds a query or fragment)", route, id)
		}
	}
}
