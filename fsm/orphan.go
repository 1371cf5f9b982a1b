package fsm

import "time"

// DefaultOrphanGrace is how long an NMC spec entry of a Module that does not exist is kept before
// it is removed.
const DefaultOrphanGrace = 5 * time.Minute
