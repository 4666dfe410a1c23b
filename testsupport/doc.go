// Package testsupport is the parent of snapsvc's test and benchmark support:
// the conformance replay of captured snapd answers (conformance), the bench
// strategies (benchkit), a driven clock (testclock), loopback listeners
// (testnet), the restart budgets' contract (budgetcontract) and a rollout's
// measure from the machines' changes (rollouttest). None of it ships in the library: only tests, the benchmark
// command and the integration suite import it, and it is not API (it may
// change in any release). What ships lives in snapsvc/, retry/, fake/ and
// internal/ (the wire client and the file lock).
package testsupport
