package io.pyflinkndb.bridge;

import java.util.Collection;
import java.util.Map;

/**
 * A tiny JSON writer for the bind info. Hand-written on purpose: the shaded Jackson inside
 * flink-dist changes its package name with every flink-shaded release, and the bridge only
 * ever writes flat maps of strings, numbers, booleans, nulls and string arrays.
 */
final class Json {

    private Json() {}

    /** Appends {@code value} as JSON. Supports null, String, Boolean, Number, Map, Collection, String[]. */
    static void write(StringBuilder out, Object value) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof String) {
            writeString(out, (String) value);
        } else if (value instanceof Boolean) {
            out.append(((Boolean) value) ? "true" : "false");
        } else if (value instanceof Long
                || value instanceof Integer
                || value instanceof Short
                || value instanceof Byte) {
            out.append(value.toString());
        } else if (value instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                writeString(out, String.valueOf(e.getKey()));
                out.append(':');
                write(out, e.getValue());
            }
            out.append('}');
        } else if (value instanceof Collection) {
            writeArray(out, ((Collection<?>) value).toArray());
        } else if (value instanceof Object[]) {
            writeArray(out, (Object[]) value);
        } else {
            throw new IllegalArgumentException(
                    "Json.write: unsupported type " + value.getClass().getName());
        }
    }

    static String toJson(Object value) {
        StringBuilder sb = new StringBuilder(256);
        write(sb, value);
        return sb.toString();
    }

    private static void writeArray(StringBuilder out, Object[] items) {
        out.append('[');
        for (int i = 0; i < items.length; i++) {
            if (i > 0) {
                out.append(',');
            }
            write(out, items[i]);
        }
        out.append(']');
    }

    static void writeString(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"':
                    out.append("\\\"");
                    break;
                case '\\':
                    out.append("\\\\");
                    break;
                case '\n':
                    out.append("\\n");
                    break;
                case '\r':
                    out.append("\\r");
                    break;
                case '\t':
                    out.append("\\t");
                    break;
                case '\b':
                    out.append("\\b");
                    break;
                case '\f':
                    out.append("\\f");
                    break;
                default:
                    // Control characters, and the two line separators JavaScript dislikes.
                    if (c < 0x20 || c == '\u2028' || c == '\u2029') {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        out.append('"');
    }
}
