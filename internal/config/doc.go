// Package config reads the Sluice configuration file, the YAML file shared by cmd/ingress and
// cmd/worker.
//
// # Model
//
// A file goes through two stages. decode reads the YAML strictly into a raw tree whose leaves
// are text: unknown keys are errors, and so are an empty file and a second YAML document, so a
// truncating save cannot load an empty config. build turns the raw tree into a [Config]: the
// environment overrides first (SLUICE_REDIS_URL, SLUICE_NATS_URL, SLUICE_LISTEN,
// SLUICE_ADMIN_LISTEN, SLUICE_ADMIN_TOKEN, SLUICE_ID_SECRET), then every value parsed in its own
// field's words, every default filled in (the Default* constants: defaults live here and
// nowhere else; the accessors such as [Rule.KeyParts] give a hand-built value's zero fields
// the same defaults), every number and duration bounded. [Load] reads a file; [Parse] takes
// bytes and an injectable environment.
//
// A [Watcher] reloads the file on SIGHUP (or whatever its Signals delivers) and when the
// file's content changes: it watches the directory, so editors that rename a new file over the old one and
// Kubernetes ConfigMap symlink swaps are seen, and debounces the events of one save.
//
// # Guarantees
//
// A Config from Load or Parse is complete and valid; it is a plain value, never changed after
// Parse returns: share it freely, do not modify it. A file that cannot be used yields an
// [*Error] that lists every problem, not the first, one per line, each naming the file (and
// the line, for decoding problems), the rule or queue, and the field:
//
//	sluice.yaml: rules[2] "login": period must be > 0
//	sluice.yaml:14: rules[3] "search": unknown field "algoritm"
//
// Parse never panics on any input (FuzzParse holds it). A Watcher hands each valid new Config
// to OnChange and each failure to OnError, from one goroutine, one at a time; a change saved
// between the caller's Load and the Watcher's start is not missed (Current). What a process
// does with them — the one reload policy — is internal/app's.
//
// # Costs
//
// Parsing is for start-up and reloads only, and allocates freely (BENCHMARKS.md, "config").
// A Watcher holds one inotify watch on the file's directory and a timer; a file whose content
// did not change is read and compared, never parsed. History and the alternatives not taken:
// docs/design/config.md.
package config
