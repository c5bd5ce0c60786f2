// Package lease grants, renews and releases leases on named locks in etcd
// with the queue recipe, and returns each grant's create revision as its
// fencing token.
//
// Each acquisition gets its own etcd lease and one queue key,
// <prefix>locks/<escaped name>/<lease id>, attached to that lease. The key
// with the lowest create revision holds the lock; every other contender
// watches only its immediate predecessor (the rule: admission.go). A granted lease is renewed only by
// KeepAlive: nothing in this package renews it on its own.
package lease
