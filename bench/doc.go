// Package bench holds rategate's benchmarks; it has no code of its own.
//
//   - `make bench` (bench/run.sh, bench/runner): the load benchmark. wrk and
//     a fixed-rate generator (bench/openloop) against NGINX + rategate +
//     Redis, against bench/minimal (the minimal limiter a team would write
//     instead) and against the floor (NGINX + bench/floor, a do-nothing 204
//     server), alternated, on loopback; results as ratios, CPU and Redis
//     time per decision and targets in bench/results/.
//   - redisinstr: instructions redis-server executes per decision of the
//     function library, counted under callgrind (a figure that does not
//     move with the machine's load): go run ./bench/redisinstr -cases u,urg
//   - micro_test.go: Go micro-benchmarks of the hot path, from route
//     normalization to a whole /auth decision against a real redis-server:
//     go test -run '^$' -bench . -benchmem ./bench/
package bench
