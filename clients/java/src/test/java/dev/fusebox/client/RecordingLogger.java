package dev.fusebox.client;

import java.util.ArrayList;
import java.util.List;
import org.slf4j.Marker;
import org.slf4j.event.Level;
import org.slf4j.helpers.LegacyAbstractLogger;

/** An SLF4J logger that keeps the messages it is given, every level enabled. */
final class RecordingLogger extends LegacyAbstractLogger {
  private static final long serialVersionUID = 1L;

  private final List<String> lines = new ArrayList<>();

  /** The messages so far. */
  synchronized List<String> lines() {
    return new ArrayList<>(lines);
  }

  /** How many messages so far contain {@code part}. */
  long count(String part) {
    return lines().stream().filter(l -> l.contains(part)).count();
  }

  @Override
  protected String getFullyQualifiedCallerName() {
    return null;
  }

  @Override
  protected synchronized void handleNormalizedLoggingCall(
      Level level, Marker marker, String message, Object[] args, Throwable t) {
    lines.add(message);
  }

  @Override
  public boolean isTraceEnabled() {
    return true;
  }

  @Override
  public boolean isDebugEnabled() {
    return true;
  }

  @Override
  public boolean isInfoEnabled() {
    return true;
  }

  @Override
  public boolean isWarnEnabled() {
    return true;
  }

  @Override
  public boolean isErrorEnabled() {
    return true;
  }
}
