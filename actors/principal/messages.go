package principal

type (
	// Leave asks the principal to leave a room: the fence goes first, so
	// nothing of the ending membership is answered or sent afterwards, then
	// the homeserver is told. Reply: *Left.
	Leave struct {
		RoomID string
	}
	// Left answers Leave.
	Left struct{ Err error }

	// stopped reports that a loop of the actor ended with a fault the
	// actor cannot carry on from (the access token stopped working).
	stopped struct {
		loop string
		err  error
	}
)
