package app

import "errors"

// errNoEmbedded is what a build without the embedded NATS server (-tags noembed) answers to a
// config without a nats section.
var errNoEmbedded = errors.New("no nats section, and this build has no embedded NATS server (built with -tags noembed, as the production image is): set nats.url or SLUICE_NATS_URL")
