"""Internal: plain building blocks that import nothing of dbqueue above them: payload encoding,
names checked before they reach SQL, queue-limit values, handlers' results and the wake-up
signals every layer shares, and the name dbqueue is installed under."""
