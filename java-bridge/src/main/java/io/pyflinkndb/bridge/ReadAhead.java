package io.pyflinkndb.bridge;

import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedList;
import java.util.List;
import java.util.Map;

/**
 * The bundle of records a keyed process operator holds back so that Python can read their keys'
 * entries from the database in one query before they are processed ({@code
 * state.backend.ndb.read-ahead.records}, {@code read-ahead.max-wait-ms}).
 *
 * <p>Reading ahead pays only while reads miss tiers 1-2 (after a restore, or for keys not seen for
 * long). When Python reports that a bundle saved nothing ({@link #observe} with 0; heard only once
 * the bundles have grown to full size), the next
 * {@link #FIRST_PASS_THROUGH} records pass straight through, then twice as many after each further
 * bundle that saved nothing, up to {@link #MAX_PASS_THROUGH}; a bundle that saved reads resets it.
 *
 * <p>The bundles start small and double up to the capacity (1, 2, 4, ... records): the first
 * record after a restore waits only for its own read, not for a whole bundle to arrive and be
 * read from a database whose pages are cold (issue 9, failure → first record), and the few
 * small bundles cost a handful of queries more.
 *
 * <p>Not thread-safe: used only from the task (mailbox) thread.
 */
final class ReadAhead<T> {

    static final int FIRST_PASS_THROUGH = 1_000;
    static final int MAX_PASS_THROUGH = 65_536;

    final int capacity;
    final long maxWaitMs;

    /**
     * True: every record is held back and each bundle is processed in one call into the
     * interpreter ({@code bundle.records}); reading ahead, if on, then only decides whether the
     * bundle's keys are read first ({@link #readAheadFor}). False: records are held back only
     * while reading ahead pays ({@link #admit}).
     */
    final boolean processesBundles;

    /** Whether bundles read their keys ahead ({@code read-ahead.records} above 0). */
    final boolean readsAhead;

    private List<StreamRecord<T>> buffered;

    /** Changes with each {@link #take}: a wait timer of an earlier bundle finds it changed. */
    private long generation;

    /** Records that fill the current bundle: 1 at first, doubled after each bundle. */
    private int target = 1;

    /**
     * True once a bundle was taken whose target was the capacity: until then a bundle that saved
     * nothing does not start a pass-through (a bundle of 2 records of keys already read says
     * little, and a pass-through right after a restore would send each record's read alone).
     */
    private boolean rampedUp;

    private int passThroughLeft;
    private int nextPassThrough = FIRST_PASS_THROUGH;

    /** Holds records back only while reading ahead pays (no bundle processing). */
    ReadAhead(int capacity, long maxWaitMs) {
        this(capacity, maxWaitMs, false, true);
    }

    ReadAhead(int capacity, long maxWaitMs, boolean processesBundles, boolean readsAhead) {
        if (capacity < 1 || maxWaitMs < 1) {
            throw new IllegalArgumentException("read-ahead: capacity and wait must be >= 1");
        }
        this.capacity = capacity;
        this.maxWaitMs = maxWaitMs;
        this.processesBundles = processesBundles;
        this.readsAhead = readsAhead;
        this.buffered = new ArrayList<>(capacity);
    }

    /**
     * False while records pass straight through (counts the record); always true when bundles are
     * processed in one call.
     */
    boolean admit() {
        if (processesBundles) {
            return true;
        }
        if (passThroughLeft > 0) {
            passThroughLeft--;
            return false;
        }
        return true;
    }

    /**
     * Whether a bundle of {@code size} records that is processed in one call reads its keys ahead:
     * not while reading ahead is off, nor while it saved nothing of late (the pass-through of
     * {@link #observe}, counted in records here).
     */
    boolean readAheadFor(int size) {
        if (!readsAhead) {
            return false;
        }
        if (passThroughLeft > 0) {
            passThroughLeft = Math.max(0, passThroughLeft - size);
            return false;
        }
        return true;
    }

    /** Adds a record (a copy the caller owns); true when it is the first of a new bundle. */
    boolean add(StreamRecord<T> record) {
        buffered.add(record);
        return buffered.size() == 1;
    }

    boolean isFull() {
        return buffered.size() >= Math.min(target, capacity);
    }

    boolean isEmpty() {
        return buffered.isEmpty();
    }

    long generation() {
        return generation;
    }

    /** The bundle, in arrival order; the buffer starts a new one. */
    List<StreamRecord<T>> take() {
        generation++;
        rampedUp |= target >= capacity;
        target = (int) Math.min(2L * target, capacity);
        List<StreamRecord<T>> out = buffered;
        buffered = new ArrayList<>(capacity);
        return out;
    }

    /**
     * A copy of {@code external} whose {@code Object[]} arrays (at any depth, inside lists and
     * maps too) are new: PyFlink's {@code RowDataConverter} and {@code TupleDataConverter} reuse
     * their output arrays from one record to the next, and a bundle hands all its records to
     * Python at once. Its {@code ListDataConverter} and {@code MapDataConverter} make a new list
     * or map per record, but of the element converter's (reused) arrays: such a list or map is
     * copied too (a {@code LinkedList}, a {@code LinkedHashMap} in the same order), else every
     * record of the bundle saw the last record's rows (found by a breaker: a key of type {@code
     * ROW(STRING, LIST(TUPLE(INT, INT)))} counted under another key). A list or map without
     * arrays in it is returned as it is, not copied.
     */
    static Object copyArrays(Object external) {
        if (external instanceof Object[]) {
            Object[] array = ((Object[]) external).clone();
            for (int i = 0; i < array.length; i++) {
                array[i] = copyArrays(array[i]);
            }
            return array;
        }
        if (external instanceof List) {
            List<?> list = (List<?>) external;
            List<Object> copy = null;
            int i = 0;
            for (Object element : list) {
                Object copied = copyArrays(element);
                if (copy == null && copied != element) {
                    copy = new LinkedList<>(list.subList(0, i));
                }
                if (copy != null) {
                    copy.add(copied);
                }
                i++;
            }
            return copy == null ? external : copy;
        }
        if (external instanceof Map) {
            Map<?, ?> map = (Map<?, ?>) external;
            Map<Object, Object> copy = null;
            int i = 0;
            for (Map.Entry<?, ?> entry : map.entrySet()) {
                Object key = copyArrays(entry.getKey());
                Object value = copyArrays(entry.getValue());
                if (copy == null && (key != entry.getKey() || value != entry.getValue())) {
                    // The first entry that holds arrays: the entries before it as they are.
                    copy = new LinkedHashMap<>();
                    int j = 0;
                    for (Map.Entry<?, ?> before : map.entrySet()) {
                        if (j++ == i) {
                            break;
                        }
                        copy.put(before.getKey(), before.getValue());
                    }
                }
                if (copy != null) {
                    copy.put(key, value);
                }
                i++;
            }
            return copy == null ? external : copy;
        }
        return external;
    }

    /** Python's answer for a bundle: the store reads it saved or needed (0: nothing to gain). */
    void observe(long gain) {
        if (gain > 0 || !rampedUp) {
            nextPassThrough = FIRST_PASS_THROUGH;
        } else {
            passThroughLeft = nextPassThrough;
            nextPassThrough = Math.min(2 * nextPassThrough, MAX_PASS_THROUGH);
        }
    }
}
